"""One model of each Hugging Face family vgame has been run on, at toy size, built from its config
with random initialisation: causal and masked language models and encoder-decoders on Tiny
Shakespeare's characters, image classifiers on the 8x8 digits, audio classifiers on the same digits
read as 64-sample waveforms. ``family`` picks one (``vgame train
--model family=T5``); ``experts`` is a mixture of experts' ``experts_implementation`` (transformers'
default, torch's grouped matmul, is refused naming that switch). docs/benchmarks.md, "Hugging Face
families", gives what each did.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import transformers

from game.api import Task, TensorData, TokenWindows, task
from game.training.task import data as packaged

_H = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=20,
)
_LLAMA_LIKE = dict(_H, num_key_value_heads=1, head_dim=8)
_ENC_DEC = dict(
    d_model=16,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=16,
    decoder_start_token_id=0,
)
_T5 = dict(
    d_model=16,
    d_kv=8,
    d_ff=32,
    num_layers=1,
    num_heads=2,
    relative_attention_num_buckets=8,
    decoder_start_token_id=0,
)
# SpecAugment on: its time masks come from numpy's global generator (seeded per micro-batch)
_AUDIO = dict(
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    conv_dim=[8, 8],
    conv_stride=[2, 2],
    conv_kernel=[3, 3],
    num_conv_pos_embeddings=4,
    num_conv_pos_embedding_groups=2,
    mask_time_prob=0.2,
    mask_time_length=2,
    mask_time_min_masks=1,
)
_MOE = dict(num_local_experts=4, num_experts_per_tok=2)
_VIT = dict(_H, image_size=8, patch_size=4)
_CONVNEXT = dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], patch_size=2, drop_path_rate=0.1)

#: family -> (config class, model class, sizes, kind): "causal" (next character), "masked" and
#: "seq2seq" (the model's own loss on labels), "image" and "audio" (a 10-way classifier of a digit
#: as an image or as a waveform)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "Llama": ("LlamaConfig", "LlamaForCausalLM", _LLAMA_LIKE, "causal"),
    "Qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _LLAMA_LIKE, "causal"),
    "Qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _LLAMA_LIKE, "causal"),
    "Mistral": ("MistralConfig", "MistralForCausalLM", _LLAMA_LIKE, "causal"),
    "Gemma": ("GemmaConfig", "GemmaForCausalLM", _LLAMA_LIKE, "causal"),
    "Gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_LLAMA_LIKE, num_hidden_layers=2), "causal"),
    "Gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", _LLAMA_LIKE, "causal"),
    "Phi": ("PhiConfig", "PhiForCausalLM", _H, "causal"),
    "Phi3": ("Phi3Config", "Phi3ForCausalLM", _LLAMA_LIKE, "causal"),
    "Starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", _LLAMA_LIKE, "causal"),
    "Olmo2": ("Olmo2Config", "Olmo2ForCausalLM", _H, "causal"),
    "StableLm": ("StableLmConfig", "StableLmForCausalLM", dict(_H, num_key_value_heads=2), "causal"),
    "Cohere": ("CohereConfig", "CohereForCausalLM", dict(_H, num_key_value_heads=2), "causal"),
    "Granite": ("GraniteConfig", "GraniteForCausalLM", dict(_H, num_key_value_heads=2), "causal"),
    "GPT2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=16, n_layer=1, n_head=2, n_positions=16), "causal"),
    "GPTBigCode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(n_embd=16, n_layer=1, n_head=2, n_positions=16),
                   "causal"),
    "GPTNeo": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(hidden_size=16, num_layers=2, num_heads=2, window_size=4,
               attention_types=[[["global", "local"], 1]], max_position_embeddings=16), "causal"),
    "GPTNeoX": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _H, "causal"),
    "OPT": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            ffn_dim=32, max_position_embeddings=16, word_embed_proj_dim=16), "causal"),
    # splits its fused query-key-value projection by advanced indexing
    "Falcon": ("FalconConfig", "FalconForCausalLM", dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               new_decoder_architecture=False), "causal"),
    "Bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=16, n_layer=1, n_head=2), "causal"),
    # a sinusoid table in float64 at construction (pow, sin, cos), each value rounded to nearest float32
    "GPTJ": ("GPTJConfig", "GPTJForCausalLM", dict(n_embd=16, n_layer=1, n_head=2, n_positions=16, rotary_dim=4),
             "causal"),
    "CodeGen": ("CodeGenConfig", "CodeGenForCausalLM", dict(n_embd=16, n_layer=1, n_head=4, n_positions=16, n_ctx=16,
                rotary_dim=4), "causal"),
    # its own initialisation takes a log of its recurrence's decay parameters
    "RecurrentGemma": ("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", dict(hidden_size=16, num_hidden_layers=3,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=32, lru_width=16,
                       attention_window_size=4, conv1d_width=2), "causal"),
    "Olmo": ("OlmoConfig", "OlmoForCausalLM", _H, "causal"),
    "Persimmon": ("PersimmonConfig", "PersimmonForCausalLM", _H, "causal"),
    "Nemotron": ("NemotronConfig", "NemotronForCausalLM", _LLAMA_LIKE, "causal"),
    "XLNet": ("XLNetConfig", "XLNetLMHeadModel", dict(d_model=16, n_layer=1, n_head=2, d_inner=32), "causal"),
    # its own initialisation is orthogonal: a QR factorisation, served by Householder's in a fixed order
    "RWKV": ("RwkvConfig", "RwkvForCausalLM", dict(hidden_size=16, num_hidden_layers=2, attention_hidden_size=16,
             intermediate_size=32, context_length=16), "causal"),
    # its forward fills a tensor in the default dtype with float64's least value: the step's dtype
    "XGLM": ("XGLMConfig", "XGLMForCausalLM", dict(d_model=16, num_layers=1, attention_heads=2, ffn_dim=32,
             max_position_embeddings=16), "causal"),
    "Mamba": ("MambaConfig", "MambaForCausalLM", dict(hidden_size=16, num_hidden_layers=1, state_size=4, expand=2,
              conv_kernel=2), "causal"),
    "Mamba2": ("Mamba2Config", "Mamba2ForCausalLM", dict(hidden_size=16, num_hidden_layers=1, state_size=4, expand=2,
               conv_kernel=2, num_heads=4, head_dim=8, n_groups=1, chunk_size=4), "causal"),
    "FalconMamba": ("FalconMambaConfig", "FalconMambaForCausalLM", dict(hidden_size=16, num_hidden_layers=1,
                    state_size=4, expand=2, conv_kernel=2), "causal"),
    # mixtures of experts: top-k routing, each expert's rows gathered and added back by index
    "Mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(_LLAMA_LIKE, **_MOE), "causal"),
    "Qwen2Moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(_H, num_key_value_heads=2, num_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16), "causal"),
    "OlmoE": ("OlmoeConfig", "OlmoeForCausalLM", dict(_H, num_experts=4, num_experts_per_tok=2), "causal"),
    "GraniteMoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(_H, num_key_value_heads=2, num_local_experts=4,
                   num_experts_per_tok=2), "causal"),
    # its router draws Gumbel noise in training (exponential_, served)
    "Phimoe": ("PhimoeConfig", "PhimoeForCausalLM", dict(_LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2),
               "causal"),
    # attention, Mamba and experts in one model
    "Jamba": ("JambaConfig", "JambaForCausalLM", dict(_LLAMA_LIKE, mamba_d_state=4, mamba_d_conv=2, mamba_expand=2,
              num_experts=2, num_experts_per_tok=1, attn_layer_period=1, attn_layer_offset=0, expert_layer_period=1,
              expert_layer_offset=0, use_mamba_kernels=False), "causal"),
    # the scan of 50 more (docs/benchmarks.md): decoders, mixtures of experts (DeepSeek's latent attention
    # and shared experts among them) and hybrids of attention with Mamba-2 or short convolutions
    "Cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(_H, num_key_value_heads=2, sliding_window=4), "causal"),
    "Exaone4": ("Exaone4Config", "Exaone4ForCausalLM", dict(_LLAMA_LIKE, sliding_window=4), "causal"),
    "Glm": ("GlmConfig", "GlmForCausalLM", _LLAMA_LIKE, "causal"),
    "Glm4": ("Glm4Config", "Glm4ForCausalLM", _LLAMA_LIKE, "causal"),
    "Helium": ("HeliumConfig", "HeliumForCausalLM", _LLAMA_LIKE, "causal"),
    "HunYuanDenseV1": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", _LLAMA_LIKE, "causal"),
    # its activation's parameters made in bfloat16 at construction (log of expm1)
    "Apertus": ("ApertusConfig", "ApertusForCausalLM", _LLAMA_LIKE, "causal"),
    "Arcee": ("ArceeConfig", "ArceeForCausalLM", _LLAMA_LIKE, "causal"),
    "Ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", _LLAMA_LIKE, "causal"),
    "Ministral": ("MinistralConfig", "MinistralForCausalLM", _LLAMA_LIKE, "causal"),
    "Olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(_H, sliding_window=4), "causal"),
    "SmolLM3": ("SmolLM3Config", "SmolLM3ForCausalLM", _LLAMA_LIKE, "causal"),
    "BitNet": ("BitNetConfig", "BitNetForCausalLM", _LLAMA_LIKE, "causal"),
    "Doge": ("DogeConfig", "DogeForCausalLM", dict(_LLAMA_LIKE, keep_window_size=4), "causal"),
    "Lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(_LLAMA_LIKE, num_hidden_layers=2, layer_types=["conv",
             "full_attention"], conv_L_cache=2), "causal"),
    "DeepseekV2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(_H, num_key_value_heads=2, kv_lora_rank=8,
                   q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=4,
                   num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=0, n_shared_experts=1,
                   n_group=1, topk_group=1), "causal"),
    "DeepseekV3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(_H, num_key_value_heads=2, kv_lora_rank=8,
                   q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=4,
                   num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=0, n_shared_experts=1,
                   n_group=1, topk_group=1), "causal"),
    "Dots1": ("Dots1Config", "Dots1ForCausalLM", dict(_LLAMA_LIKE, n_routed_experts=4, num_experts_per_tok=2,
              moe_intermediate_size=16, first_k_dense_replace=0, n_shared_experts=1, n_group=1, topk_group=1),
              "causal"),
    "Qwen3Moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(_LLAMA_LIKE, num_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=16), "causal"),
    "Ernie4_5_Moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", dict(_LLAMA_LIKE, moe_num_experts=4, moe_k=2,
                     moe_intermediate_size=16, moe_layer_start_index=0), "causal"),
    "GptOss": ("GptOssConfig", "GptOssForCausalLM", dict(_LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2,
               sliding_window=4), "causal"),
    "GraniteMoeShared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", dict(_H, num_key_value_heads=2,
                         num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=16), "causal"),
    "JetMoe": ("JetMoeConfig", "JetMoeForCausalLM", dict(hidden_size=16, num_hidden_layers=1, num_key_value_heads=2,
               kv_channels=8, intermediate_size=32, max_position_embeddings=20, num_local_experts=4,
               num_experts_per_tok=2), "causal"),
    "MiniMax": ("MiniMaxConfig", "MiniMaxForCausalLM", dict(_LLAMA_LIKE, num_hidden_layers=2, num_local_experts=4,
                num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"], block_size=4), "causal"),
    "Zamba": ("ZambaConfig", "ZambaForCausalLM", dict(_H, num_key_value_heads=2, attention_hidden_size=32,
              mamba_d_state=4, mamba_d_conv=2, mamba_expand=2, mamba_dt_rank=4, n_mamba_heads=2, num_hidden_layers=3,
              layers_block_type=["mamba", "hybrid", "hybrid"], use_mamba_kernels=False), "causal"),
    "Zamba2": ("Zamba2Config", "Zamba2ForCausalLM", dict(_H, num_key_value_heads=2, mamba_d_state=4, mamba_d_conv=2,
               mamba_expand=2, mamba_headdim=8, n_mamba_heads=4, mamba_ngroups=1, num_hidden_layers=3,
               layers_block_type=["mamba", "hybrid", "hybrid"], use_mem_eff_path=False, chunk_size=4), "causal"),
    "Bamba": ("BambaConfig", "BambaForCausalLM", dict(_H, num_key_value_heads=2, mamba_d_state=4, mamba_d_conv=2,
              mamba_expand=2, mamba_d_head=8, mamba_n_heads=4, mamba_n_groups=1, mamba_chunk_size=4,
              num_hidden_layers=2, attn_layer_indices=[1]), "causal"),
    "FalconH1": ("FalconH1Config", "FalconH1ForCausalLM", dict(_H, num_key_value_heads=2, head_dim=8, mamba_d_state=4,
                 mamba_d_conv=2, mamba_expand=2, mamba_d_head=8, mamba_n_heads=4, mamba_n_groups=1, mamba_chunk_size=4,
                 mamba_d_ssm=32), "causal"),
    "GraniteMoeHybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", dict(_H, num_key_value_heads=2,
                         num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=16, mamba_d_state=4,
                         mamba_d_conv=2, mamba_expand=2, mamba_d_head=8, mamba_n_heads=4, mamba_n_groups=1,
                         mamba_chunk_size=4, num_hidden_layers=2, layer_types=["mamba", "attention"]), "causal"),
    "BioGpt": ("BioGptConfig", "BioGptForCausalLM", _H, "causal"),
    "Bert": ("BertConfig", "BertForMaskedLM", _H, "masked"),
    "Roberta": ("RobertaConfig", "RobertaForMaskedLM", _H, "masked"),
    "XLMRoberta": ("XLMRobertaConfig", "XLMRobertaForMaskedLM", _H, "masked"),
    "DistilBert": ("DistilBertConfig", "DistilBertForMaskedLM", dict(dim=16, n_layers=1, n_heads=2, hidden_dim=32,
                   max_position_embeddings=16), "masked"),
    "Albert": ("AlbertConfig", "AlbertForMaskedLM", dict(_H, embedding_size=8), "masked"),
    "Electra": ("ElectraConfig", "ElectraForMaskedLM", dict(_H, embedding_size=8), "masked"),
    "DebertaV2": ("DebertaV2Config", "DebertaV2ForMaskedLM", _H, "masked"),
    "ModernBert": ("ModernBertConfig", "ModernBertForMaskedLM", dict(_H, global_attn_every_n_layers=1), "masked"),
    "MPNet": ("MPNetConfig", "MPNetForMaskedLM", _H, "masked"),
    "BigBird": ("BigBirdConfig", "BigBirdForMaskedLM", dict(_H, attention_type="original_full"), "masked"),
    "Longformer": ("LongformerConfig", "LongformerForMaskedLM", dict(_H, attention_window=4), "masked"),
    "Funnel": ("FunnelConfig", "FunnelForMaskedLM", dict(d_model=16, n_head=2, d_head=8, d_inner=32, block_sizes=[1, 1],
               num_decoder_layers=1), "masked"),
    # Fourier mixing: a complex FFT in place of attention
    "FNet": ("FNetConfig", "FNetForMaskedLM", dict(hidden_size=16, num_hidden_layers=1, intermediate_size=32,
             max_position_embeddings=16), "masked"),
    "SqueezeBert": ("SqueezeBertConfig", "SqueezeBertForMaskedLM", dict(_H, embedding_size=16, q_groups=2, k_groups=2,
                    v_groups=2, post_attention_groups=2, intermediate_groups=2, output_groups=2), "masked"),
    # a Nystrom approximation of attention, with torch.eye in the default dtype
    "Nystromformer": ("NystromformerConfig", "NystromformerForMaskedLM", dict(_H, num_landmarks=4,
                      segment_means_seq_len=8), "masked"),
    "ConvBert": ("ConvBertConfig", "ConvBertForMaskedLM", dict(_H, embedding_size=16, head_ratio=2,
                 conv_kernel_size=3), "masked"),
    "RoFormer": ("RoFormerConfig", "RoFormerForMaskedLM", dict(_H, embedding_size=16), "masked"),
    "Ernie": ("ErnieConfig", "ErnieForMaskedLM", _H, "masked"),
    "Data2VecText": ("Data2VecTextConfig", "Data2VecTextForMaskedLM", _H, "masked"),
    "Camembert": ("CamembertConfig", "CamembertForMaskedLM", _H, "masked"),
    "MegatronBert": ("MegatronBertConfig", "MegatronBertForMaskedLM", _H, "masked"),
    # multi-resolution attention: casts its queries and keys to float32 on purpose (``.float()``)
    # and hands them to float64 layers (widen.mixed)
    "Mra": ("MraConfig", "MraForMaskedLM", _H, "masked"),
    "Yoso": ("YosoConfig", "YosoForMaskedLM", dict(_H, use_expectation=True, use_fast_hash=False), "masked"),
    "RemBert": ("RemBertConfig", "RemBertForMaskedLM", dict(_H, input_embedding_size=16, output_embedding_size=16),
                "masked"),
    "RoCBert": ("RoCBertConfig", "RoCBertForMaskedLM", dict(_H, pronunciation_embed_dim=8, shape_embed_dim=8,
                enable_pronunciation=False, enable_shape=False), "masked"),
    "MobileBert": ("MobileBertConfig", "MobileBertForMaskedLM", dict(_H, embedding_size=16, intra_bottleneck_size=16,
                   true_hidden_size=16, num_feedforward_networks=1), "masked"),
    "Esm": ("EsmConfig", "EsmForMaskedLM", dict(_H, position_embedding_type="rotary", mask_token_id=1), "masked"),
    "Xmod": ("XmodConfig", "XmodForMaskedLM", dict(_H, languages=["en_XX"], default_language="en_XX"), "masked"),
    "IBert": ("IBertConfig", "IBertForMaskedLM", _H, "masked"),
    # relative-position buckets through a log of 0 on lanes it then drops: an inf, which passes
    "T5": ("T5Config", "T5ForConditionalGeneration", _T5, "seq2seq"),
    "MT5": ("MT5Config", "MT5ForConditionalGeneration", _T5, "seq2seq"),
    "Bart": ("BartConfig", "BartForConditionalGeneration", _ENC_DEC, "seq2seq"),
    "Pegasus": ("PegasusConfig", "PegasusForConditionalGeneration", _ENC_DEC, "seq2seq"),
    "Marian": ("MarianConfig", "MarianMTModel", _ENC_DEC, "seq2seq"),
    "ProphetNet": ("ProphetNetConfig", "ProphetNetForConditionalGeneration", dict(hidden_size=16, encoder_ffn_dim=32,
                   decoder_ffn_dim=32, num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=2,
                   num_decoder_attention_heads=2, max_position_embeddings=16, ngram=2, num_buckets=8,
                   decoder_start_token_id=0), "seq2seq"),
    "LongT5": ("LongT5Config", "LongT5ForConditionalGeneration", _T5, "seq2seq"),
    "UMT5": ("UMT5Config", "UMT5ForConditionalGeneration", _T5, "seq2seq"),
    # T5 with a mixture of experts in its sparse layers
    "SwitchTransformers": ("SwitchTransformersConfig", "SwitchTransformersForConditionalGeneration", dict(_T5,
                           num_experts=4, expert_capacity=8, num_sparse_encoder_layers=1,
                           num_sparse_decoder_layers=1), "seq2seq"),
    # sinusoidal positions made at construction
    "M2M100": ("M2M100Config", "M2M100ForConditionalGeneration", _ENC_DEC, "seq2seq"),
    "MBart": ("MBartConfig", "MBartForConditionalGeneration", _ENC_DEC, "seq2seq"),
    "PLBart": ("PLBartConfig", "PLBartForConditionalGeneration", _ENC_DEC, "seq2seq"),
    "Blenderbot": ("BlenderbotConfig", "BlenderbotForConditionalGeneration", _ENC_DEC, "seq2seq"),
    "LED": ("LEDConfig", "LEDForConditionalGeneration", dict(_ENC_DEC, max_encoder_position_embeddings=16,
            max_decoder_position_embeddings=16, attention_window=[4]), "seq2seq"),
    "BigBirdPegasus": ("BigBirdPegasusConfig", "BigBirdPegasusForConditionalGeneration", dict(_ENC_DEC,
                       attention_type="original_full"), "seq2seq"),
    "PegasusX": ("PegasusXConfig", "PegasusXForConditionalGeneration", dict(_ENC_DEC, num_global_tokens=2,
                 block_size=4), "seq2seq"),
    "BlenderbotSmall": ("BlenderbotSmallConfig", "BlenderbotSmallForConditionalGeneration", _ENC_DEC, "seq2seq"),
    "NllbMoe": ("NllbMoeConfig", "NllbMoeForConditionalGeneration", dict(_ENC_DEC, num_experts=4, expert_capacity=8,
                encoder_sparse_step=1, decoder_sparse_step=1), "seq2seq"),
    "ViT": ("ViTConfig", "ViTForImageClassification", _VIT, "image"),
    "DeiT": ("DeiTConfig", "DeiTForImageClassification", _VIT, "image"),
    "Beit": ("BeitConfig", "BeitForImageClassification", _VIT, "image"),
    "Dinov2": ("Dinov2Config", "Dinov2ForImageClassification", _VIT, "image"),
    "Swin": ("SwinConfig", "SwinForImageClassification", dict(image_size=8, patch_size=2, embed_dim=8, depths=[1],
             num_heads=[2], window_size=2), "image"),
    # stochastic depth at rates from torch.linspace at construction, served exactly there
    "ConvNext": ("ConvNextConfig", "ConvNextForImageClassification", _CONVNEXT, "image"),
    "ConvNextV2": ("ConvNextV2Config", "ConvNextV2ForImageClassification", _CONVNEXT, "image"),
    "Segformer": ("SegformerConfig", "SegformerForImageClassification", dict(num_encoder_blocks=2, depths=[1, 1],
                  sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2], patch_sizes=[3, 3],
                  strides=[2, 2], mlp_ratios=[2, 2]), "image"),
    "ResNet": ("ResNetConfig", "ResNetForImageClassification", dict(embedding_size=8, hidden_sizes=[8, 16],
               depths=[1, 1], layer_type="basic"), "image"),
    "RegNet": ("RegNetConfig", "RegNetForImageClassification", dict(embedding_size=8, hidden_sizes=[8, 16],
               depths=[1, 1], groups_width=8), "image"),
    "MobileNetV2": ("MobileNetV2Config", "MobileNetV2ForImageClassification", dict(image_size=8,
                    depth_multiplier=0.25), "image"),
    "MobileViT": ("MobileViTConfig", "MobileViTForImageClassification", dict(image_size=8, patch_size=2,
                  hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 8, 8, 8, 8, 16], num_attention_heads=2), "image"),
    "PoolFormer": ("PoolFormerConfig", "PoolFormerForImageClassification", dict(hidden_sizes=[8, 16, 16, 16],
                   depths=[1, 1, 1, 1], patch_sizes=[3, 3, 3, 3], strides=[2, 2, 1, 1], padding=[1, 1, 1, 1]), "image"),
    "PvtV2": ("PvtV2Config", "PvtV2ForImageClassification", dict(image_size=8, hidden_sizes=[8, 16], depths=[1, 1],
              num_attention_heads=[1, 2], sr_ratios=[2, 1], patch_sizes=[3, 3], strides=[2, 2], mlp_ratios=[2, 2],
              num_encoder_blocks=2), "image"),
    "Swinv2": ("Swinv2Config", "Swinv2ForImageClassification", dict(image_size=8, patch_size=2, embed_dim=8, depths=[1],
               num_heads=[2], window_size=2), "image"),
    "FocalNet": ("FocalNetConfig", "FocalNetForImageClassification", dict(image_size=8, patch_size=2, embed_dim=8,
                 depths=[1, 1], focal_levels=[1, 1], focal_windows=[3, 3]), "image"),
    "Hiera": ("HieraConfig", "HieraForImageClassification", dict(image_size=[8, 8], patch_size=[3, 3], patch_stride=[2,
              2], patch_padding=[1, 1], embed_dim=8, num_heads=[1, 2], depths=[1, 1], embed_dim_multiplier=2.0,
              num_query_pool=1, query_stride=[2, 2], masked_unit_size=[2, 2], masked_unit_attention=[True, False]),
              "image"),
    "Bit": ("BitConfig", "BitForImageClassification", dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
            layer_type="preactivation", global_padding="SAME", num_groups=4), "image"),
    "Cvt": ("CvtConfig", "CvtForImageClassification", dict(embed_dim=[8, 8, 16], num_heads=[1, 1, 2], depth=[1, 2, 3],
            patch_sizes=[3, 3, 3], patch_stride=[2, 1, 1], patch_padding=[1, 1, 1], drop_path_rate=[0.0, 0.0, 0.1]),
            "image"),
    "SwiftFormer": ("SwiftFormerConfig", "SwiftFormerForImageClassification", dict(image_size=8, depths=[1, 1, 1, 1],
                    embed_dims=[8, 8, 16, 16]), "image"),
    "TextNet": ("TextNetConfig", "TextNetForImageClassification", dict(stem_num_channels=1, stem_out_channels=8,
                conv_layer_kernel_sizes=[[[3, 3]], [[3, 3]], [[3, 3]], [[3, 3]]], conv_layer_strides=[[1], [2], [2],
                [2]], hidden_sizes=[8, 8, 8, 16, 16]), "image"),
    "HGNetV2": ("HGNetV2Config", "HGNetV2ForImageClassification", dict(embedding_size=8, hidden_sizes=[16, 16, 16, 16],
                depths=[1, 1, 1, 1], stem_channels=[1, 8, 8], stage_in_channels=[8, 16, 16, 16], stage_mid_channels=[8,
                8, 8, 8], stage_out_channels=[16, 16, 16, 16], stage_num_blocks=[1, 1, 1, 1], stage_downsample=[False,
                True, True, True], stage_light_block=[False, False, True, True], stage_kernel_size=[3, 3, 3, 3],
                stage_numb_of_layers=[1, 1, 1, 1]), "image"),
    "Dinov2WithRegisters": ("Dinov2WithRegistersConfig", "Dinov2WithRegistersForImageClassification", dict(_VIT,
                            num_register_tokens=2), "image"),
    # a weight norm at construction (its norm served exactly) and SpecAugment's masks from numpy
    "Wav2Vec2": ("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification", _AUDIO, "audio"),
    "Hubert": ("HubertConfig", "HubertForSequenceClassification", _AUDIO, "audio"),
    # its attention's dropout runs inside torch's F.multi_head_attention_forward (served for the call)
    "WavLM": ("WavLMConfig", "WavLMForSequenceClassification", _AUDIO, "audio"),
    "UniSpeech": ("UniSpeechConfig", "UniSpeechForSequenceClassification", _AUDIO, "audio"),
    "Data2VecAudio": ("Data2VecAudioConfig", "Data2VecAudioForSequenceClassification", dict(_AUDIO,
                      num_conv_pos_embeddings=2, conv_pos_kernel_size=2), "audio"),
    "SEW": ("SEWConfig", "SEWForSequenceClassification", dict(_AUDIO, squeeze_factor=1), "audio"),
    "SEWD": ("SEWDConfig", "SEWDForSequenceClassification", dict(_AUDIO, squeeze_factor=1, position_buckets=8,
             max_position_embeddings=16), "audio"),
    "Wav2Vec2Conformer": ("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerForSequenceClassification", dict(_AUDIO,
                          conv_depthwise_kernel_size=3, position_embeddings_type="rotary"), "audio"),
}  # fmt: skip


#: The mixtures of experts, which take ``experts``.
MIXTURES = frozenset({
    "Mixtral", "Qwen2Moe", "OlmoE", "GraniteMoe", "Jamba", "Phimoe", "DeepseekV2", "DeepseekV3", "Dots1", "Qwen3Moe",
    "Ernie4_5_Moe", "GptOss", "GraniteMoeShared", "MiniMax", "GraniteMoeHybrid",
})  # fmt: skip


def _loss(kind: str) -> Any:
    def loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        if kind == "causal":
            logits = model(input_ids=x).logits
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        if kind == "image":
            return model(pixel_values=x.unsqueeze(1), labels=y).loss
        if kind == "audio":
            return model(input_values=x.reshape(x.shape[0], -1), labels=y).loss
        return model(input_ids=x, labels=y).loss  # masked and seq2seq: the model's own loss

    return loss


@task(model={"family": "Llama", "experts": "eager"}, optimizer="adamw", lr=1e-3, batch_size=2, steps=3)
def build(cfg):  # type: ignore[no-untyped-def]
    """The task of family ``cfg.model.family`` (one of :data:`FAMILIES`)."""
    family = cfg.model.family
    if family not in FAMILIES:
        raise ValueError(f"no family {family!r}: the families are {', '.join(sorted(FAMILIES))}")
    config_name, model_name, sizes, kind = FAMILIES[family]
    options = dict(sizes)
    if kind in ("image", "audio"):
        options.update(num_labels=10, **({"num_channels": 1} if kind == "image" else {}))
        data = TensorData(*packaged.digits_split("train"))
    else:
        options.update(vocab_size=len(packaged.vocab()), pad_token_id=0, bos_token_id=0, eos_token_id=0)
        data = TokenWindows(packaged.shakespeare_tokens("train"), 8)
    if family in MIXTURES:
        options["experts_implementation"] = cfg.model.experts
    config = getattr(transformers, config_name)(**options)
    model = getattr(transformers, model_name)
    return Task(model=lambda: model(config), dataset=data, loss=_loss(kind), libraries=("transformers",))
