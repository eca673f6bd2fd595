"""Wrong implementations that the hostile cases pair with their tricks, one per chapter.

Each is plausible but wrong, so that a case can only score full marks if its trick works.
A case may override the chapter's entry with its own ``WRONG`` dict.
"""

WRONG = {
    "ch99_toy": '''\
def scaled_sum(x, alpha):
    """Forgets alpha."""
    return x.sum(dim=-1)


class LinearNoBias(nn.Module):
    """Stores the weight transposed, (in, out), and adds a bias."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x):
        return x @ self.weight + self.bias
''',
}
