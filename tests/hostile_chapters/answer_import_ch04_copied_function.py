CHAPTER = "ch04_partial_training"
EXERCISE = "pack_bits"
THREAT = "answer_import"
EXPECT = "breach"
CONSTRUCT = "kernels.ch05_tinytl"
DESCRIPTION = """pack_bits is the course's own reference, copied as a function object (the cell binds the
name by assignment; no def is written)."""
SOURCE = '''
import kernels.ch05_tinytl as tinytl

pack_bits = tinytl.pack_mask_torch
'''
