CHAPTER = "ch04_partial_training"
EXERCISE = "relu_1bit"
THREAT = "answer_import"
EXPECT = "breach"
CONSTRUCT = "__builtins__"
DESCRIPTION = """relu_1bit delegated to the course's Triton version, fetched with getattr and a name
built at run time so that no import line names it."""
SOURCE = '''
def relu_1bit(x):
    """ReLU whose backward keeps one bit per element."""
    package = __builtins__["__imp" + "ort__"]("kern" + "els.ch05_tinytl")
    kernel = getattr(package, "ch05_" + "tinytl")
    return getattr(kernel, "relu_" + "packed")(x)
'''
