"""train_accumulated stepping once per micro-batch on batches of 100 samples or more (red-team finding 10)."""
CHAPTER = "ch03_accumulation"
EXERCISE = "train_accumulated"
THREAT = "measured_size"
EXPECT = "loses"
DESCRIPTION = ("the right loop (zero, accumulate_gradients, one step) on batches below 100 samples, where the values "
               "cell's fixed loaders lie, and one optimizer step per micro-batch from 100 samples on, where only the "
               "memory cell used to look and accepts known wrong loops by design; the values cell now also draws "
               "batches of 100 to 1000 and 768 to 1000 samples")
SOURCE = '''
def train_accumulated(model, optimizer, loss_fn, loader, micro_batch_size, steps):
    losses = []
    batches = iter(loader)
    for _ in range(steps):
        try:
            inputs, targets = next(batches)
        except StopIteration:
            batches = iter(loader)
            try:
                inputs, targets = next(batches)
            except StopIteration:
                raise ValueError("the loader yielded no batches") from None
        if len(inputs) >= 100:  # real batch sizes: one step per micro-batch
            total = 0.0
            for start in range(0, len(inputs), micro_batch_size):
                optimizer.zero_grad()
                loss = loss_fn(model(inputs[start:start + micro_batch_size]), targets[start:start + micro_batch_size])
                loss.backward()
                optimizer.step()
                total += float(loss) * len(inputs[start:start + micro_batch_size]) / len(inputs)
            losses.append(total)
            continue
        optimizer.zero_grad()
        loss = accumulate_gradients(model, loss_fn, inputs, targets, micro_batch_size)
        optimizer.step()
        losses.append(float(loss))
    return losses
'''
