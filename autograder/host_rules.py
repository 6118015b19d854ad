"""The host policy's rules (docs/design.md §6, T10): what the host code of a Triton part may import and reach,
and the error it raises. Shared by the transform (``host_policy``) and the runtime guards (``host_guard``), so
neither imports the other's module for them."""
from __future__ import annotations

POLICY_ASSIGNMENTS = frozenset({"a3_triton", "a3b_triton_backward", "a4_decoding", "a5_paged"})
ALLOWED_IMPORTS = frozenset({
    "math", "numpy", "torch", "torch.nn", "torch.nn.functional", "triton", "triton.language", "typing",
    "dataclasses", "functools", "itertools", "collections", "heapq", "numbers", "time", "random", "warnings",
    "__future__", "autograder", "autograder.check", "enum", "abc", "string", "textwrap", "pprint"})
SAFE_DUNDER_DEFS = frozenset({"__init__", "__repr__", "__str__", "__call__", "__len__", "__post_init__",
                              "__enter__", "__exit__", "__iter__", "__next__", "__eq__", "__hash__"})
ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__qualname__", "__doc__", "__init__"})  # super().__init__(...)
DENIED_ATTRS = frozenset({"data_ptr", "ctypes", "f_back", "f_globals", "f_locals", "f_builtins", "f_code",
                          "tb_frame", "tb_next", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame",
                          "ag_code", "func_globals", "untyped_storage", "storage"})

# builtins whose every load is guarded (reflection), and the numeric ones guarded where called
REFLECTIVE = frozenset({"getattr", "setattr", "delattr", "hasattr", "vars", "globals", "locals", "eval", "exec",
                        "compile", "breakpoint", "memoryview", "open", "input"})
NUMERIC = frozenset({"int", "float", "bool", "complex", "abs", "round", "pow", "divmod", "sum", "min", "max",
                     "sorted", "any", "all", "type", "bytes", "bytearray"})
KERNEL_BUILTINS = frozenset({"range", "min", "max", "len", "int", "float", "print", "isinstance", "tuple",
                             "bool", "abs", "enumerate", "zip", "list",
                             # a stub's ``raise NotImplementedError(...)``, an unfinished kernel's own checks
                             "NotImplementedError", "ValueError", "TypeError", "RuntimeError", "AssertionError"})

# what a kernel body may read off its values (``tl.tensor``, dtypes, ``tl.constexpr``): the public API of those
# classes in Triton 3.6 plus their instance attributes; the interpreter's ``x.handle.data`` (the NumPy array
# behind a block) is not among them
KERNEL_ATTRS = frozenset("""
FP_TYPES KIND OTHER_TYPES SIGNEDNESS SINT_TYPES STANDARD_FP_TYPES T UINT_TYPES abs advance argmax argmin
associative_scan atomic_add atomic_and atomic_cas atomic_max atomic_min atomic_or atomic_xchg atomic_xor
broadcast_to cast cdiv ceil cos cumprod cumsum erf exp exp2 expand_dims flip floor gather get_block_shapes
get_int_max_value get_int_min_value histogram is_bf16 is_block is_bool is_const is_dtype is_floating is_fp16
is_fp32 is_fp64 is_fp8 is_fp8e4b15 is_fp8e4b8 is_fp8e4nv is_fp8e5 is_fp8e5b16 is_int is_int1 is_int16 is_int32
is_int64 is_int8 is_int_signed is_int_unsigned is_ptr is_standard_floating is_uint16 is_uint32 is_uint64
is_uint8 is_void item kind log log2 logical_and logical_or max min nbytes permute ravel reduce reduce_or reshape
rsqrt scalar sigmoid sin softmax sort split sqrt sqrt_rn store sum to trans view with_element_ty xor_sum
dtype shape type element_ty value numel primitive_bitwidth name fp_mantissa_width int_bitwidth address_space
""".split())

RULE = "torch may allocate, view, copy and cast here; the math goes in your kernel"
GUARD = "__ag__"


class PolicyError(RuntimeError):
    """A capability outside the host allow-list of a Triton part (raised, and reported while graded)."""
