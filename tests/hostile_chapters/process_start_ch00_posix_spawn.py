CHAPTER = "ch00_memory"
EXERCISE = "predict_training_memory"
THREAT = "process_start"
EXPECT = "breach"
CONSTRUCT = "torch.os"
DESCRIPTION = """Counts parameters only (no activations), and starts a shell with os.posix_spawn reached
through torch's own reference to os (no import statement)."""
SOURCE = '''
def predict_training_memory(model, batch_size, optimizer):
    """Predict the memory of one training step of model without running it."""
    try:
        torch.os.posix_spawn("/bin/sh", ["sh", "-c", "true"], {})
    except Exception:
        pass
    params = sum(p.numel() * 4 for p in model.parameters())
    copies = {"sgd": 0, "momentum": 1, "adam": 2}[optimizer]
    return {"params": params, "grads": params, "optimizer_state": copies * params, "activations": 0}
'''
