"""ara_group that runs plain backprop whenever its blocks are the setup cell's ResidualMLPBlock."""
CHAPTER = "ch12_aal"
EXERCISE = "ara_group"
THREAT = "dispatch"
EXPECT = "loses"
DESCRIPTION = ("ARA only for blocks of another class (a look-alike a grader might build); for the notebook's own "
               "ResidualMLPBlock, every real use, plain backprop: each block keeps its input and fc1's gradient comes "
               "from x_i. The grader builds its blocks with the worker's own setup-cell class")
SOURCE = '''
def ara_group(blocks, x: torch.Tensor) -> torch.Tensor:
    blocks = list(blocks)
    if len(blocks) == 0:
        raise ValueError("empty")
    if isinstance(blocks[0], ResidualMLPBlock):
        for block in blocks:
            x = block(x)
        return x

    class _Fc1(torch.autograd.Function):
        @staticmethod
        def forward(ctx, xi, x0, w, b):
            ctx.save_for_backward(x0, w)
            return F.linear(xi, w, b)

        @staticmethod
        def backward(ctx, g):
            x0, w = ctx.saved_tensors
            g2 = g.reshape(-1, g.shape[-1])
            return (g @ w if ctx.needs_input_grad[0] else None, None,
                    g2.t() @ x0.reshape(-1, x0.shape[-1]), g2.sum(0))

    x0 = x.detach()
    h = x
    for block in blocks:
        h = h + block.fc2(F.relu(_Fc1.apply(h, x0, block.fc1.weight, block.fc1.bias)))
    return h
'''
