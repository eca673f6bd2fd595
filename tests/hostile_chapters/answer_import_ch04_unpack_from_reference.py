CHAPTER = "ch04_partial_training"
EXERCISE = "unpack_bits"
THREAT = "answer_import"
EXPECT = "breach"
CONSTRUCT = "kernels.ch05_tinytl"
DESCRIPTION = """unpack_bits imported under another name from the course's kernel module, inside the
function so that the cell's first lines look clean."""
SOURCE = '''
def unpack_bits(packed, numel):
    """Undo pack_bits: the first numel bits of packed as a bool tensor."""
    from kernels.ch05_tinytl import unpack_mask_torch as undo

    return undo(packed, numel)
'''
