"""Hugging Face GPT-2 and Llama built from small configs with random weights:
nothing is downloaded. Importing this module fails without `transformers`."""

from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


from fsdpc.models.language import cross_entropy_over_tokens, token_batch


def _causal_lm_loss(model, tokens, targets):
    return cross_entropy_over_tokens(model(input_ids=tokens, use_cache=False).logits, targets)


def make_hf_gpt2(batch: int = 2, seq: int = 16, **_options):
    config = GPT2Config(vocab_size=1021, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return GPT2LMHeadModel(config), token_batch(config.vocab_size, batch, seq), _causal_lm_loss


def make_hf_llama(batch: int = 2, seq: int = 16, **_options):
    config = LlamaConfig(vocab_size=509, hidden_size=64, intermediate_size=160,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, attn_implementation="eager")
    return LlamaForCausalLM(config), token_batch(config.vocab_size, batch, seq), _causal_lm_loss
