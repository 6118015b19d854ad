"""The Hopper wing of ``reference.triton``: kernels written for an H100/H200 (sm_90a) apart from the teaching
kernels of lectures 5-8 and assignments a3-a5 (``reference/triton/*.py``).

| module | what |
|---|---|
| ``flash_gluon`` | FA3-style Gluon forward: warp-specialised, ping-pong, persistent (``flash_attention_forward_gluon``) |
| ``flash_gluon_bwd_ws`` | warp-specialised Gluon backward (``flash_attention_backward_gluon_ws``) |
| ``flash_gluon_autograd`` | both as one ``torch.autograd.Function`` (``flash_attention_gluon``) |
| ``flash_fp8`` | FP8 (e4m3) Triton forward, per-block scales, Hadamard option (``flash_attention_forward_fp8``) |
| ``flash_fp8_gluon`` | the same FP8 forward as a warp-specialised Gluon kernel (``flash_attention_forward_fp8_gluon``) |
| ``fp8_quant`` | the FP8 forwards' quantisation of Q, K, V as one Triton launch (``quantize_qkv_fp8``) |
| ``flash_persistent`` | persistent Triton forward with LPT tile order (``flash_attention_forward_persistent``) |
| ``common`` | what the Gluon modules share: checks, TMA descriptors, backward pre/post-processing, jit helpers |
| ``_aot`` | compile a kernel for sm_90a without a GPU and read registers / spills / SASS (``aot_report`` prints them) |

The public names are re-exported by ``reference.triton``. The measured ablations of the Gluon forward live in
``experiments/gluon_schedules.py`` (which imports this package, never the other way round).
"""
