"""apply_meprop replaces every Linear, the output layer included, then assigns a generator function to the
returned model's named_modules that lists the original dense Linear where the sparse one sits: modules(),
named_parameters() and any probe that asks the model itself see the right structure. Probes read the
structure from the tables calling the model uses; it must lose the output-layer cells."""
CHAPTER = "ch06_sparse_backprop"
EXERCISE = "apply_meprop"
THREAT = "lying_object"
EXPECT = "loses"
DESCRIPTION = __doc__
SOURCE = r'''
def apply_meprop(model, k, unified=False):
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} contains no nn.Linear to sparsify")
    last_name = linears[-1]
    original_last = model.get_submodule(last_name)
    for name in linears:  # every Linear, the output layer too
        if name:
            model.set_submodule(name, MePropLinear(model.get_submodule(name), k, unified))
    if last_name:
        sparse_last = model.get_submodule(last_name)

        def listing(memo=None, prefix="", remove_duplicate=True):
            for n, m in nn.Module.named_modules(model, memo, prefix, remove_duplicate):
                yield n, (original_last if m is sparse_last else m)

        model.named_modules = listing
    return model
'''
