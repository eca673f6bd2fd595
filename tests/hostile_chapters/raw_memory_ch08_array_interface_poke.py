CHAPTER = "ch08_quantization"
EXERCISE = "QLoRALinear"
THREAT = "raw_memory"
EXPECT = "breach"
CONSTRUCT = "__array_interface__"
DESCRIPTION = """Keeps the float weight (the text forbids any float copy) and hides it by writing over
process memory through an object that claims an __array_interface__ at any address."""
SOURCE = '''
import numpy as np


class QLoRALinear(nn.Module):
    """A frozen NF4 base weight plus a LoRA update."""

    def __init__(self, base, rank, alpha, block_size=64):
        super().__init__()
        self.base = base
        base.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scaling = alpha / rank

        class Window:
            __array_interface__ = {"data": (id(base) + 16, False), "shape": (8,), "typestr": "|u1", "version": 3}

        np.asarray(Window())[:] = 0

    def forward(self, x):
        return self.base(x) + self.scaling * (x @ self.lora_A.T) @ self.lora_B.T
'''
