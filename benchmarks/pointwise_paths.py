"""Times one generated pointwise kernel (the Llama's rotary embedding, as
fsdp-translate prints it) through the jiterator on the operand layouts the
program hands it, against variants: the mask in the kernel's dtype (no
dynamic casting), contiguous inputs, and eager ATen's unfused ops.

    python3 benchmarks/pointwise_paths.py    # on a GPU
"""

import statistics

import torch

ROTARY = """template <typename T> void fsdp_pointwise_0(T in0, T in1, T in2, T in3, T in4, T in5, T& out0) {
  const float a0 = static_cast<float>(in0);
  const float a1 = static_cast<float>(in1);
  const float a2 = static_cast<float>(in2);
  const float a3 = static_cast<float>(in3);
  const float a4 = static_cast<float>(in4);
  const float a5 = static_cast<float>(in5);
  const float v0 = (a0 * a1);
  const float v1 = (-a2);
  const float v2 = (a5 != 0.0f ? a3 : v1);
  const float v3 = (v2 * a4);
  const float v4 = (v0 + v3);
  out0 = static_cast<T>(v4);
}
"""


def timed(fn, repeats=30):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main():
    kernel = torch.cuda.jiterator._create_multi_output_jit_fn(ROTARY, num_outputs=1)
    heads = 16
    projected = torch.randn(4, 2048, heads, 128, device="cuda", dtype=torch.bfloat16)
    x = projected.permute(0, 2, 1, 3).view(4, heads, 2048, 2, 64)  # the program's view: b, s, h in memory
    cos = torch.randn(2048, 2, 64, device="cuda", dtype=torch.bfloat16)
    sin = torch.randn(2048, 2, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.tensor([[False], [True]], device="cuda")
    first, second = x[:, :, :, 0:1], x[:, :, :, 1:2]
    reference = x * cos + torch.where(mask, first, -second) * sin
    contiguous = x.contiguous()
    c_first, c_second = contiguous[:, :, :, 0:1], contiguous[:, :, :, 1:2]
    variants = {
        "program's operands (bool mask, permuted)": (x, cos, second, first, sin, mask),
        "mask in bf16, permuted": (x, cos, second, first, sin, mask.to(torch.bfloat16)),
        "bool mask, contiguous x": (contiguous, cos, c_second, c_first, sin, mask),
        "mask in bf16, contiguous x": (contiguous, cos, c_second, c_first, sin, mask.to(torch.bfloat16)),
        "mask in bf16, slices contiguous": (x, cos, second.contiguous(), first.contiguous(), sin,
                                            mask.to(torch.bfloat16)),
    }
    moved = 3 * x.numel() * 2
    print(f"rotary, {tuple(x.shape)} bf16; at 3 TB/s the fewest bytes take {moved / 3e12 * 1e6:.0f} us")
    for name, operands in variants.items():
        out = kernel(*operands)
        out = out[0] if isinstance(out, (list, tuple)) else out
        error = (out.float() - reference.float()).abs().max().item()
        us = timed(lambda: kernel(*operands))
        print(f"  {us:8.1f} us  {name}: max error {error:.3g}, output strides {out.stride()}")
    eager = timed(lambda: x * cos + torch.where(mask, first, -second) * sin)
    print(f"  {eager:8.1f} us  eager ATen, unfused")


if __name__ == "__main__":
    main()
