"""One rank (launched by test_hugging_face.py) that trains Hugging Face
architectures as users load them: built from small configs with random
weights (nothing is downloaded), default attention ("sdpa", the boolean
masks it builds; decoders' batches padded on either side), default
`use_cache`, dropout off so that eager compares;
each through `fsdpc.shard` and one training call, against eager PyTorch's
loss and gradients on a copy; and each captured for a CUDA target in bf16
(no GPU needed), sharded for 2 NCCL ranks and lowered to a program that
validates, with the fused attention kernel eager would pick. Writes each
architecture's result to --out (json): a failure is recorded with its
reason, and the next one runs."""

import argparse
import copy
import json
import tempfile
import traceback

import torch
import torch.distributed as dist
import transformers

import fsdpc
from fsdpc.capture import MixedPrecision
from fsdpc.compiler import run_fsdp_opt
from fsdpc.export import export_training_step
from fsdpc.program import translate

VOCAB, BATCH, SEQ = 311, 2, 16
IMAGE = 32


def causal(model, tokens, mask, labels):
    return model(input_ids=tokens, attention_mask=mask, labels=labels).loss


def masked(model, tokens, targets):
    logits = model(input_ids=tokens).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def seq2seq(model, tokens, targets):
    return model(input_ids=tokens, labels=targets).loss


def classified(model, pixels, labels):
    return model(pixel_values=pixels, labels=labels).loss


def pooled(model, pixels, labels):
    # Not a function of the norm alone: a layer-normed vector's mean square is 1 whatever the weights.
    pooled = model(pixel_values=pixels).pooler_output
    return (pooled * torch.linspace(-1, 1, pooled.shape[-1], device=pooled.device)).sum()


DECODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)
SPECIAL_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=1)
ENCODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
MOE = dict(num_experts_per_tok=2)

# name: (config class, model class, config, loss function); class names, so that a
# transformers without one reports it instead of failing to import.
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", DECODER, causal),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(DECODER, head_dim=16), causal),
    "mistral, sliding window": ("MistralConfig", "MistralForCausalLM", dict(DECODER, sliding_window=8), causal),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(DECODER, head_dim=16), causal),
    "gemma3, sliding window": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                               dict(DECODER, head_dim=16, sliding_window=8,
                                    layer_types=["sliding_attention", "full_attention"]), causal),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(DECODER, **SPECIAL_TOKENS), causal),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", ENCODER, causal),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                 word_embed_proj_dim=64, dropout=0.0, attention_dropout=0.0), causal),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4), causal),
    "falcon": ("FalconConfig", "FalconForCausalLM",
               dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4), causal),
    "gpt-j": ("GPTJConfig", "GPTJForCausalLM",
              dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, **SPECIAL_TOKENS), causal),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                  **SPECIAL_TOKENS), causal),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(DECODER, **SPECIAL_TOKENS), causal),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(DECODER, num_local_experts=4, **MOE), causal),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(DECODER, head_dim=16, num_experts=4, moe_intermediate_size=32, **MOE), causal),
    "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(DECODER, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4, n_group=1,
                         topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                         qk_nope_head_dim=8, v_head_dim=16, **MOE), causal),
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(DECODER, head_dim=16, num_local_experts=4, sliding_window=8, **MOE), causal),
    "bert": ("BertConfig", "BertForMaskedLM",
             dict(ENCODER, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), masked),
    "modernbert": ("ModernBertConfig", "ModernBertForMaskedLM",
                   dict(ENCODER, cls_token_id=1, sep_token_id=2, **SPECIAL_TOKENS), masked),
    "t5": ("T5Config", "T5ForConditionalGeneration",
           dict(vocab_size=VOCAB, d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, dropout_rate=0.0,
                decoder_start_token_id=0), seq2seq),
    "bart": ("BartConfig", "BartForConditionalGeneration",
             dict(vocab_size=VOCAB, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_layers=2,
                  decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, dropout=0.0,
                  attention_dropout=0.0, activation_dropout=0.0, **SPECIAL_TOKENS), seq2seq),
    "vit": ("ViTConfig", "ViTForImageClassification",
            dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE,
                 patch_size=8, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
            classified),
    "clip vision": ("CLIPVisionConfig", "CLIPVisionModel",
                    dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         image_size=IMAGE, patch_size=8), pooled),
    "mamba": ("MambaConfig", "MambaForCausalLM",
              dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, state_size=8), causal),
}


def batch_for(loss_fn) -> tuple:
    generator = torch.Generator().manual_seed(1)
    if loss_fn in (classified, pooled):
        return torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator), torch.randint(0, 10, (BATCH,),
                                                                                       generator=generator)
    if loss_fn is causal:  # a whole row, one padded on the right and one on the left, as tokenizers pad
        tokens = torch.randint(3, VOCAB, (3, SEQ), generator=generator)
        mask = torch.ones(3, SEQ, dtype=torch.long)
        mask[1, SEQ - 6:] = 0
        mask[2, :SEQ - 5] = 0
        return tokens, mask, torch.where(mask.bool(), tokens, -100)
    return tuple(torch.randint(3, VOCAB, (BATCH, SEQ), generator=generator) for _ in range(2))


def trained_against_eager(name: str) -> dict:
    config_class, model_class, options, loss_fn = ARCHITECTURES[name]
    if not hasattr(transformers, model_class):
        return {"missing": f"transformers {transformers.__version__} has no {model_class}"}
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**options))
    reference, batch = copy.deepcopy(model), batch_for(loss_fn)
    sharded = fsdpc.shard(model, batch, loss_fn)
    loss = float(sharded(*batch))
    eager = loss_fn(reference, *batch)
    eager.backward()
    pairs = {}
    for fqn, param in sharded.named_parameters():
        mine, theirs = param.grad, reference.get_parameter(fqn).grad
        mine = mine.full_tensor() if hasattr(mine, "full_tensor") else mine
        pairs[fqn] = (mine, torch.zeros_like(mine) if theirs is None else theirs)
    largest = max(float(theirs.abs().max()) for _, theirs in pairs.values())
    # Per parameter, against its own scale (a norm's or a bias's gradient is small beside a matrix's),
    # but at least a thousandth of the step's largest (a key bias's is zero in exact arithmetic: noise).
    errors = {fqn: float((mine - theirs).abs().max()) / (float(theirs.abs().max()) + 1e-3 * largest)
              for fqn, (mine, theirs) in pairs.items()}
    worst = max(errors, key=errors.get)
    return {"loss": loss, "eager": float(eager), "gradient error": errors[worst], "worst parameter": worst}


def lowered_for_cuda(name: str) -> dict:
    """The architecture captured on meta for a CUDA target in bf16, sharded
    for 2 NCCL ranks and lowered: the fused attention kernels it holds. The
    vision models are planned too (memory report, time model): their patch
    convolutions leave the pixels' gradient out, which the time model
    crashed on before 2026-11-28."""
    config_class, model_class, options, loss_fn = ARCHITECTURES[name]
    with torch.device("meta"):
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**options))
    batch = [tensor.to("meta") for tensor in batch_for(loss_fn)]
    text = export_training_step(model, batch, loss_fn, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16),
                                device="cuda").mlir
    vision = loss_fn in (classified, pooled)
    with tempfile.TemporaryDirectory() as scratch:
        pipeline = "ranks=2 backend=nccl" + (f" memory-report={scratch}/memory.json report-format=json" if vision else "")
        passes = [f"--fsdp-sharding-pipeline={pipeline}"]
        if vision:
            passes.append(f"--fsdp-step-time=gpu=h100-sxm format=json output={scratch}/time.json")
        program = translate(run_fsdp_opt(text, passes))
    kernels = sorted({call.split('"')[0] for call in text.split('fsdp.aten "')[1:]
                      if call.startswith("aten::_scaled_dot_product_")})
    return {"device": program.device_kind, "attention": kernels,
            "attention implementation": getattr(model.config, "_attn_implementation", None)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    results = {}
    for name in ARCHITECTURES:
        for check, run in (("cpu", trained_against_eager), ("cuda", lowered_for_cuda)):
            try:
                results[f"{name} on {check}"] = run(name)
            except Exception as error:  # recorded with its reason; the next check runs
                text = str(error)
                results[f"{name} on {check}"] = (
                    {"refused": text} if "the control flow depends on data" in text else
                    {"error": "".join(traceback.format_exception(error))[-4000:]})
    with open(args.out, "w") as out:
        json.dump(results, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
