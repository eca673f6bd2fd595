"""set_trainable that freezes nothing and shadows the model's parameter listing to show the mode's flags."""
CHAPTER = "ch04_partial_training"
EXERCISE = "set_trainable"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = ("leaves every parameter trainable and assigns named_parameters/parameters on the model so that "
               "the parameters the mode freezes are listed as detached views (requires_grad=False)")
SOURCE = '''
def set_trainable(model, mode):
    """Everything trains; the listing says otherwise."""
    modes = ("full", "last", "bn+last", "bias+last")
    if mode not in modes:
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(modes)}")
    keep = set()
    for path, layer in nn.Module.named_modules(model):
        for name, p in layer.named_parameters(recurse=False):
            full = f"{path}.{name}" if path else name
            if (mode == "full" or path == "classifier" or path.startswith("classifier.")
                    or (mode == "bn+last" and isinstance(layer, nn.modules.batchnorm._BatchNorm))
                    or (mode == "bias+last" and name == "bias")):
                keep.add(full)
    for p in nn.Module.parameters(model):
        p.requires_grad_(True)

    def listing(*args, **kwargs):
        for name, p in nn.Module.named_parameters(model, *args, **kwargs):
            yield name, (p if name in keep else p.detach())

    model.named_parameters = listing
    model.parameters = lambda *args, **kwargs: (p for _, p in listing(*args, **kwargs))
    return sum(p.numel() for name, p in listing() if name in keep)
'''
