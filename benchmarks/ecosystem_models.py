"""Small-config builders for the ecosystem benchmark: MONAI 3D networks and Hugging Face
transformers models as users build them (configs and constructors, never weights)."""

from __future__ import annotations


def _monai():
    from monai.networks import nets
    return nets


def monai_unet():
    return _monai().UNet(3, 1, 2, channels=(16, 32, 64, 128, 256), strides=(2, 2, 2, 2),
                         num_res_units=2)


def monai_basic_unet():
    return _monai().BasicUNet(spatial_dims=3, in_channels=1, out_channels=2)


def monai_flexible_unet():
    return _monai().FlexibleUNet(in_channels=1, out_channels=2, backbone="efficientnet-b0",
                                 spatial_dims=3, pretrained=False)


def monai_segresnet():
    return _monai().SegResNet(spatial_dims=3, in_channels=1, out_channels=2, init_filters=16)


def monai_segresnet_vae():
    return _monai().SegResNetVAE(input_image_size=(96, 96, 96), spatial_dims=3, in_channels=1,
                                 out_channels=2)


def monai_swin_unetr():
    return _monai().SwinUNETR(in_channels=1, out_channels=2, feature_size=48)


def monai_swin_unetr_v2():
    return _monai().SwinUNETR(in_channels=1, out_channels=2, feature_size=24, use_v2=True)


def monai_unetr():
    return _monai().UNETR(in_channels=1, out_channels=2, img_size=(96, 96, 96))


def monai_dynunet():
    return _monai().DynUNet(3, 1, 2, kernel_size=[3, 3, 3, 3], strides=[1, 2, 2, 2],
                            upsample_kernel_size=[2, 2, 2])


def monai_attention_unet():
    return _monai().AttentionUnet(3, 1, 2, channels=(16, 32, 64, 128), strides=(2, 2, 2))


def monai_vnet():
    return _monai().VNet(spatial_dims=3, in_channels=1, out_channels=2)


def monai_densenet121_3d():
    return _monai().DenseNet121(spatial_dims=3, in_channels=1, out_channels=4)


def monai_resnet18_3d():
    return _monai().resnet18(spatial_dims=3, n_input_channels=1, num_classes=4)


def monai_highresnet():
    return _monai().HighResNet(spatial_dims=3, in_channels=1, out_channels=2)


def monai_vit_3d():
    return _monai().ViT(in_channels=1, img_size=(96, 96, 96), patch_size=(16, 16, 16),
                        classification=True, num_classes=4)


def monai_unest_like_autoencoder():
    return _monai().AutoEncoder(3, 1, 1, channels=(8, 16, 32), strides=(2, 2, 2))


SMALL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=256, vocab_size=1000)


def _causal(config_name: str, **extra):
    import transformers

    config = getattr(transformers, config_name)(**{**SMALL, **extra})
    return transformers.AutoModelForCausalLM.from_config(config)


def hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=1000))


def hf_llama():
    return _causal("LlamaConfig", num_key_value_heads=2)


def hf_mistral():
    return _causal("MistralConfig", num_key_value_heads=2)


def hf_qwen2():
    return _causal("Qwen2Config", num_key_value_heads=2)


def hf_gemma():
    return _causal("GemmaConfig", num_key_value_heads=2, head_dim=32)


def hf_phi3():
    return _causal("Phi3Config", num_key_value_heads=4, pad_token_id=0)


def hf_opt():
    from transformers import OPTConfig, OPTForCausalLM
    return OPTForCausalLM(OPTConfig(hidden_size=128, num_hidden_layers=2, ffn_dim=256,
                                    num_attention_heads=4, vocab_size=1000,
                                    word_embed_proj_dim=128))


def hf_gpt_neox():
    return _causal("GPTNeoXConfig")


def hf_mixtral():
    return _causal("MixtralConfig", num_key_value_heads=2, num_local_experts=4,
                   num_experts_per_tok=2)


def hf_qwen2_moe():
    return _causal("Qwen2MoeConfig", num_key_value_heads=2, num_experts=4,
                   num_experts_per_tok=2, moe_intermediate_size=64,
                   shared_expert_intermediate_size=128)


def _masked(config_name: str, model_name: str, **extra):
    import transformers
    config = getattr(transformers, config_name)(**{**SMALL, **extra})
    return getattr(transformers, model_name)(config)


def hf_bert():
    return _masked("BertConfig", "BertForMaskedLM")


def hf_roberta():
    return _masked("RobertaConfig", "RobertaForMaskedLM")


def hf_distilbert():
    from transformers import DistilBertConfig, DistilBertForMaskedLM
    return DistilBertForMaskedLM(DistilBertConfig(dim=128, n_layers=2, n_heads=4,
                                                  hidden_dim=256, vocab_size=1000))


def hf_deberta_v2():
    return _masked("DebertaV2Config", "DebertaV2ForMaskedLM")


def hf_electra():
    return _masked("ElectraConfig", "ElectraForMaskedLM", embedding_size=128)


def hf_t5():
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(vocab_size=1000, d_model=128, d_ff=256,
                                               num_layers=2, num_heads=4, d_kv=32,
                                               decoder_start_token_id=0, pad_token_id=0))


hf_t5_labels = hf_t5


def hf_bart():
    from transformers import BartConfig, BartForConditionalGeneration
    return BartForConditionalGeneration(BartConfig(
        vocab_size=1000, d_model=128, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
        decoder_ffn_dim=256))


def hf_whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    return WhisperForConditionalGeneration(WhisperConfig(
        d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256))


def hf_wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC
    return Wav2Vec2ForCTC(Wav2Vec2Config(hidden_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=256,
                                         vocab_size=32))


def hf_vit():
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(hidden_size=128, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=256,
                                               num_labels=10))


def hf_clip():
    from transformers import CLIPConfig, CLIPModel
    text = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=256, vocab_size=1000)
    vision = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=256)
    return CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=64))
