CHAPTER = "ch09_mixed_precision"
EXERCISE = "GradScaler"
THREAT = "spec_gap"
EXPECT = "breach"
CONSTRUCT = "torch.amp.GradScaler"
DESCRIPTION = """A GradScaler that forwards every call to torch.amp.GradScaler: it matches the
reference trajectory exactly, and the exercise text forbids it."""
SOURCE = '''
class GradScaler:
    """Dynamic loss scaling."""

    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.inner = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth_factor,
                                          backoff_factor=backoff_factor, growth_interval=growth_interval)

    def scale(self, loss):
        return self.inner.scale(loss)

    def unscale_(self, optimizer):
        self.inner.unscale_(optimizer)

    def step(self, optimizer):
        return self.inner.step(optimizer)

    def update(self):
        self.inner.update()

    def get_scale(self):
        return self.inner.get_scale()
'''
