"""ara_group that keeps a copy of the group input per block on large inputs only."""
CHAPTER = "ch12_aal"
EXERCISE = "ara_group"
THREAT = "measured_call"
EXPECT = "loses"
DESCRIPTION = ("right values everywhere; below a million elements every block shares x_0, above it each block saves "
               "its own copy (one stored tensor per block instead of one per group): the memory cell's outside "
               "reading, on a group input drawn at grading time, sees the copies")
SOURCE = '''
def ara_group(blocks, x):
    """ARA, with private copies of x_0 on large inputs."""
    blocks = list(blocks)
    if not blocks:
        raise ValueError("empty group")
    large = x.numel() >= 1_000_000

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, x0, w, b):
            ctx.save_for_backward(x0.clone() if large else x0, w)
            return F.linear(h, w, b)

        @staticmethod
        def backward(ctx, g):
            x0, w = ctx.saved_tensors
            rows = g.reshape(-1, g.shape[-1])
            return g @ w, None, rows.t() @ x0.reshape(-1, x0.shape[-1]), rows.sum(0)

    x0 = x.detach()
    h = x
    for block in blocks:
        h = h + block.fc2(F.relu(Fn.apply(h, x0, block.fc1.weight, block.fc1.bias)))
    return h
'''
