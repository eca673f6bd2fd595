CHAPTER = "ch09_mixed_precision"
EXERCISE = "GradScaler"
THREAT = "spec_gap"
EXPECT = "breach"
CONSTRUCT = "torch.cuda.amp.GradScaler"
DESCRIPTION = """GradScaler as a thin subclass of the reference it is compared with (through the cuda
alias), which the exercise text forbids."""
SOURCE = '''
class GradScaler(torch.cuda.amp.GradScaler):
    """Dynamic loss scaling."""

    def __init__(self, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        super().__init__(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=True)
'''
