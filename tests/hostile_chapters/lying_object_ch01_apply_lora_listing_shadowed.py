"""apply_lora that leaves the model trainable and shadows its parameter listing on the instance."""
CHAPTER = "ch01_lora"
EXERCISE = "apply_lora"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = ("wraps the right layers but freezes nothing else, then assigns named_parameters/parameters on the "
               "returned model so that every parameter but lora_A/lora_B is listed as a detached view")
SOURCE = '''
def apply_lora(model, rank, alpha, targets):
    """No freezing; a listing that says otherwise."""
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            parent, _, child = name.rpartition(".")
            model.get_submodule(parent).register_module(child, LoRALinear(module, rank, alpha))
    honest = model.named_parameters

    def listing(*args, **kwargs):
        for name, p in honest(*args, **kwargs):
            yield name, (p if name.rsplit(".", 1)[-1] in ("lora_A", "lora_B") else p.detach())

    model.named_parameters = listing
    model.parameters = lambda *args, **kwargs: (p for _, p in listing(*args, **kwargs))
    return model
'''
