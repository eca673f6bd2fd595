"""pack_bits and unpack_bits that use the specified bit order (element 8k + j is bit j of byte k) on masks of at
most 64 x 64 elements, the largest the small graded masks reach, and most significant bit first above (the
listed mistake of both cells): relu_1bit packs and unpacks through them, consistently, so its values stay right.
Red-team finding 13 (rt3); the large mask of 2^20 to 15 x 2^20 elements drawn at grading time stops it."""
CHAPTER = "ch04_partial_training"
EXERCISE = "unpack_bits"
THREAT = "measured_size"
EXPECT = "loses"
DESCRIPTION = ("the unpack_bits cell redefines pack_bits too, so that both switch to most-significant-bit-first "
               "order above 4,096 elements, where only relu_1bit's measured call (12 to 15 x 2^20 elements, through "
               "the student's own pack and unpack) used to run: right bytes only at the sizes the values were "
               "graded on; test_pack_bits and test_unpack_bits must fail on the large drawn mask (8/8 before). "
               "Written as one cell, it also loses test_relu_1bit_memory: once pack_bits and unpack_bits have "
               "failed, the course's reference of each is added after the student's cell, and this cell's "
               "pack_bits outlives the one added after the pack_bits cell (the two-cell attack keeps relu_1bit's "
               "points)")
SOURCE = '''
def pack_bits(mask):
    """Pack a boolean tensor 8 elements to a byte (bit order depends on the size)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a torch.bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
    n = mask.numel()
    padded = torch.zeros(8 * math.ceil(n / 8), dtype=torch.uint8, device=mask.device)
    padded[:n] = mask.reshape(-1)
    order = [1, 2, 4, 8, 16, 32, 64, 128] if n <= 64 * 64 else [128, 64, 32, 16, 8, 4, 2, 1]
    place_values = torch.tensor(order, dtype=torch.uint8, device=mask.device)
    return (padded.view(-1, 8) * place_values).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed, numel):
    """The inverse of pack_bits (bit order depends on the size)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed must be a torch.uint8 tensor, got {packed.dtype}")
    if not 0 <= numel <= 8 * packed.numel():
        raise ValueError(f"{packed.numel()} bytes hold at most {8 * packed.numel()} bits, asked for {numel}")
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    if numel > 64 * 64:
        shifts = shifts.flip(0)
    bits = packed.reshape(-1, 1).bitwise_right_shift(shifts).bitwise_and(1)
    return bits.reshape(-1)[:numel].bool()
'''
