"""The shapes of the models the shipped recipes name, from their published ``config.json``.

Read by ``mixrl plan`` (memory and time without a download) and by the rehearsal (which
architecture family a recipe's model is). Layer 1: data only, imports nothing.
"""

#: hub id -> the fields of its config.json used here (Qwen2, Qwen3 and Llama architectures, published configs;
#: Qwen3 gives ``head_dim`` (128, not hidden / heads), has no q/k/v biases and normalises q and k per head)
KNOWN_MODELS: dict[str, dict] = {
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                     num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, model_type="qwen2",
                                     max_position_embeddings=32768),
    "Qwen/Qwen2.5-Math-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                 num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, model_type="qwen2",
                                 max_position_embeddings=4096),
    # LUFFY's variant of Qwen2.5-Math-7B with a 16k context, the model LUFFY, RL-PLUS and ExGRPO train
    # (ElliottYan/LUFFY @ 01f4ae06: exp_scripts/train.sh line 18 MODEL_PATH=Elliott/Qwen2.5-Math-7B-16k-think,
    # data.max_prompt_length=1024 + data.max_response_length=8192; README.md's SFT command, --max_len 16384;
    # ExGRPO/README.md line 123). Its own config.json was not found in the stored sources (searched: code, docs
    # and pages corpora, 2026-12-06). The sizes are Qwen2.5-Math-7B's (the same weights' shape); the two changed
    # values are those of the same author's sibling checkpoint built from it,
    # huggingface.co/Elliott/Qwen2.5-Math-7B-SFT/blob/main/config.json (revision 2a8052e): max_position_embeddings
    # 16384 (the "16k" of the name, and the SFT --max_len) and rope_theta 40000 (Qwen2.5-Math-7B: 10000).
    # A third-party listing (featherless.ai) gives 131,072 tokens for it; not used (no primary source).
    "Elliott/Qwen2.5-Math-7B-16k-think": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                              num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, model_type="qwen2",
                                              max_position_embeddings=16384, rope_theta=40000.0),
    "Qwen/Qwen2.5-Math-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                          num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, model_type="qwen2",
                                          max_position_embeddings=4096),
    "Qwen/Qwen2.5-Math-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                                   num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, model_type="qwen2",
                                   max_position_embeddings=4096),
    # huggingface.co/Qwen/Qwen3-4B-Instruct-2507/blob/main/config.json
    "Qwen/Qwen3-4B-Instruct-2507": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                                        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                                        model_type="qwen3", attention_bias=False, max_position_embeddings=262144),
    # huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B/blob/main/config.json (Qwen2.5-Math-1.5B's shape, untied LM head)
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                                                      num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False,
                                                      model_type="qwen2", max_position_embeddings=131072),
    # huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json (Llama: no q/k/v biases, no q/k norms)
    "meta-llama/Llama-3.1-8B-Instruct": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                             num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
                                             model_type="llama", attention_bias=False, max_position_embeddings=131072),
    # huggingface.co/Skywork/Skywork-Reward-Llama-3.1-8B-v0.2/blob/main/config.json: Llama-3.1-8B's body with a
    # 1-output score head; counted with an LM head (the shape formula's), 0.5B parameters more than it has
    "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                                     tie_word_embeddings=False, model_type="llama", attention_bias=False,
                                                     max_position_embeddings=131072),
    # huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
    "Qwen/Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False,
                          model_type="qwen3", attention_bias=False, max_position_embeddings=40960),
    # the built-in tiny model (mixrl.models.tiny) before it is built
    "builtin:tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=18, tie_word_embeddings=True, model_type="qwen2",
                         max_position_embeddings=64),
    # the built-in BPE chat model (mixrl.models.tiny_bpe) before it is built
    "builtin:tiny-bpe": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                             num_key_value_heads=4, vocab_size=320, tie_word_embeddings=True, model_type="qwen2",
                             max_position_embeddings=128),
    # the built-in tiny reward model (mixrl.models.tiny_rm): a one-output Qwen2 classifier over the tiny tokenizer
    "builtin:tiny-rm": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=4, vocab_size=18, tie_word_embeddings=True, model_type="qwen2",
                            max_position_embeddings=64),
}

#: hub id -> (the ``model=`` option, hub id) of the same model with a longer context: named in the fix of
#: :func:`mixrl.config.context.check_context`'s refusal
LONGER_CONTEXT: dict[str, tuple[str, str]] = {
    "Qwen/Qwen2.5-Math-7B": ("qwen2.5-math-7b-16k-think", "Elliott/Qwen2.5-Math-7B-16k-think"),
}
