CHAPTER = "ch09_mixed_precision"
EXERCISE = "GradScaler"
THREAT = "spec_gap"
EXPECT = "breach"
CONSTRUCT = "torch.amp.grad_scaler"
DESCRIPTION = """The reference scaler reached through its defining module, imported under another name
and kept on the instance."""
SOURCE = '''
from torch.amp import grad_scaler as gs


class GradScaler:
    """Dynamic loss scaling."""

    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.impl = gs.GradScaler("cpu", init_scale, growth_factor, backoff_factor, growth_interval)

    def scale(self, loss):
        return self.impl.scale(loss)

    def unscale_(self, optimizer):
        self.impl.unscale_(optimizer)

    def step(self, optimizer):
        return self.impl.step(optimizer)

    def update(self):
        self.impl.update()

    def get_scale(self):
        return self.impl.get_scale()
'''
