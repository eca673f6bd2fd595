"""DropBP that decides before the sublayer runs only when the decision is forced; random decisions are drawn after
the forward, as the authors' code does, the graph built and detached."""
CHAPTER = "ch14_dropbp"
EXERCISE = "DropBP"
THREAT = "dispatch"
EXPECT = "loses"
DESCRIPTION = ("no_grad only where the decision is known beforehand (force set, or p of 0 or 1), the places a grader "
               "might measure; every random decision, each real training step, runs the sublayer with autograd and "
               "detaches its output afterwards. The grader measures a dropped forward whose decision is a random draw "
               "from a generator it seeded at grading time")
SOURCE = '''
class DropBP(nn.Module):
    def __init__(self, sublayer, p, generator=None):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError("p must lie in [0, 1]")
        self.sublayer, self.p, self.generator = sublayer, float(p), generator
        self.force, self.dropped = None, False

    def forward(self, x):
        if not self.training:
            self.dropped = False
            return x + self.sublayer(x)
        if self.force is not None or self.p in (0.0, 1.0):
            drop = bool(self.force) if self.force is not None else self.p == 1.0
            if self.force is None:
                torch.rand((), generator=self.generator)
            self.dropped = drop
            if drop:
                with torch.no_grad():
                    return x + self.sublayer(x)
            return x + self.sublayer(x)
        out = self.sublayer(x)
        self.dropped = bool(torch.rand((), generator=self.generator) < self.p)
        return x + (out.detach() if self.dropped else out)
'''
