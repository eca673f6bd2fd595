"""average_quantize that hands the work to the course's own AQ kernel module."""
CHAPTER = "ch13_alam"
EXERCISE = "average_quantize"
THREAT = "answer_import"
EXPECT = "breach"
CONSTRUCT = "kernels.ch13_alam"
DESCRIPTION = "kernels.ch13_alam's aq_pack_torch computes average_quantize's answer (same layout): refused"
SOURCE = '''
from kernels import ch13_alam as course


def average_quantize(x, noise, average=4, group_size=128):
    return course.aq_pack_torch(x, noise, average, group_size)
'''
