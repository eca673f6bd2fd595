"""set_trainable that swaps frozen copies in for the parameters it should freeze."""
CHAPTER = "ch04_partial_training"
EXERCISE = "set_trainable"
THREAT = "detached_copy"
EXPECT = "loses"
DESCRIPTION = ("instead of setting requires_grad on the model's parameters, registers new frozen copies in place "
               "of the ones to freeze (the originals, still trainable, stay in any optimizer built before)")
SOURCE = '''
def set_trainable(model, mode):
    """Replaces instead of freezing."""
    modes = ("full", "last", "bn+last", "bias+last")
    if mode not in modes:
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(modes)}")
    total = 0
    for path, layer in list(model.named_modules()):
        for name, p in list(layer.named_parameters(recurse=False)):
            train = (mode == "full" or path == "classifier" or path.startswith("classifier.")
                     or (mode == "bn+last" and isinstance(layer, nn.modules.batchnorm._BatchNorm))
                     or (mode == "bias+last" and name == "bias"))
            if p.requires_grad != train:
                layer.register_parameter(name, nn.Parameter(p.detach().clone(), requires_grad=train))
            total += p.numel() if train else 0
    return total
'''
