"""accumulate_gradients with equal weights 1/k on batches of 100 samples or more (red-team finding 10)."""
CHAPTER = "ch03_accumulation"
EXERCISE = "accumulate_gradients"
THREAT = "measured_size"
EXPECT = "loses"
DESCRIPTION = ("weights each micro-batch n_i / B below 100 samples, where the values cell's fixed cases (B = 37) lie, "
               "and 1/k (equal weights, wrong when the last micro-batch is smaller) from 100 samples on, where only "
               "the memory cell used to look and accepts weighting mistakes by design; the values and loss cells "
               "now also draw batches of 100 to 1000 and 768 to 1000 samples")
SOURCE = '''
def accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size):
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    batch = inputs.shape[0]
    if batch == 0 or targets.shape[0] != batch:
        raise ValueError("inputs and targets must hold the same non-zero number of samples")
    chunks = -(-batch // micro_batch_size)
    total = 0.0
    for start in range(0, batch, micro_batch_size):
        x = inputs[start:start + micro_batch_size]
        y = targets[start:start + micro_batch_size]
        weight = x.shape[0] / batch if batch < 100 else 1.0 / chunks  # equal weights on real batch sizes
        loss = loss_fn(model(x), y) * weight
        loss.backward()
        total = total + loss.detach()
    return total
'''
