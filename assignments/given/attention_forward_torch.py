def attention_forward(q, k, v, causal=False, scale=None):
    """Given: the forward pass in plain torch, returning what a FlashAttention forward saves for the backward.

    ``o`` (like ``q``) and ``lse (B, Hq, Nq)`` float32, natural log; GQA and the bottom-right causal mask as in
    assignment 3; a row that sees no key gets ``o = 0``, ``lse = -inf``. It stores the whole ``Nq x Nk`` score
    matrix (fine for the small shapes of the checks): on a GPU you may call your assignment-3 kernel instead.
    """
    B, Hq, Hkv, Nq, Nk, d = check_attention_inputs(q, k, v)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    group = Hq // Hkv
    s = q.float() @ k.float().repeat_interleave(group, dim=1).transpose(-1, -2) * scale
    if causal:
        rows = torch.arange(Nq, device=q.device)[:, None]
        s = s.masked_fill(torch.arange(Nk, device=q.device)[None, :] > rows + (Nk - Nq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])  # all -inf row: exp(-inf) = 0
    return (p @ v.float().repeat_interleave(group, dim=1)).to(q.dtype), lse
