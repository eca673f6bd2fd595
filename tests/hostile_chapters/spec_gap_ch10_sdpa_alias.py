CHAPTER = "ch10_flash_attention"
EXERCISE = "flash_attention_forward"
THREAT = "spec_gap"
EXPECT = "breach"
CONSTRUCT = "as a value"
DESCRIPTION = """torch's fused attention through an alias of the functional module (f = F), with the
log-sum-exp computed from the full N x N scores."""
SOURCE = '''
import torch.nn.functional as F

f = F


def flash_attention_forward(q, k, v, causal=False, block_q=32, block_k=32):
    """Exact attention computed tile by tile with the online softmax."""
    o = f.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return o, torch.logsumexp(s.float(), dim=-1)
'''
