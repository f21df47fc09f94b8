"""The ecosystem benchmark's models: torchvision, timm, MONAI and Hugging Face transformers,
each built from code or a small config (never weights), with the options a user would give,
and memcalc's own zoo at its default shapes.

A case is (library, name, CLI arguments after ``memcalc estimate``). Factories for models that
need a config live here, referenced as ``benchmarks.ecosystem_cases:NAME``.
"""

from __future__ import annotations

from models_zoo import ZOO

LIBRARIES = ("memcalc zoo", "transformers", "MONAI 3D", "torchvision detection", "torchvision",
             "timm")
NO_WEIGHTS = ["--model-arg", "weights=none"]
DETECTION_WEIGHTS = NO_WEIGHTS + ["--model-arg", "weights_backbone=none"]
IMAGE = ["--shape", "3,224,224"]

TV_CLASSIFIERS = [
    "alexnet", "vgg11", "vgg16_bn", "resnet18", "resnet50", "resnet152", "resnext50_32x4d",
    "wide_resnet50_2", "squeezenet1_1", "densenet121", "densenet201", "inception_v3",
    "googlenet", "shufflenet_v2_x1_0", "mobilenet_v2", "mobilenet_v3_small",
    "mobilenet_v3_large", "mnasnet1_0", "efficientnet_b0", "efficientnet_b3",
    "efficientnet_v2_s", "regnet_x_400mf", "regnet_x_1_6gf", "regnet_x_8gf", "regnet_y_400mf",
    "regnet_y_1_6gf", "regnet_y_8gf", "regnet_y_16gf", "regnet_x_3_2gf", "regnet_y_3_2gf",
    "regnet_x_800mf", "regnet_y_800mf", "regnet_x_16gf", "regnet_x_32gf", "regnet_y_32gf",
    "vit_b_16", "vit_b_32", "vit_l_32", "swin_t", "swin_v2_t", "convnext_tiny", "convnext_small",
    "maxvit_t", "resnet34", "resnet101", "vgg13", "vgg19", "vgg11_bn", "densenet161",
    "densenet169", "shufflenet_v2_x0_5", "mnasnet0_5", "efficientnet_b1", "efficientnet_b2",
    "efficientnet_v2_m", "swin_s", "swin_v2_s", "convnext_base", "resnext101_32x8d",
    "wide_resnet101_2", "squeezenet1_0", "vit_l_16", "regnet_y_128gf",
]
TV_VIDEO = ["r3d_18", "mc3_18", "r2plus1d_18", "s3d", "mvit_v1_b", "mvit_v2_s", "swin3d_t"]
TV_SEGMENTATION = ["fcn_resnet50", "deeplabv3_resnet50", "deeplabv3_mobilenet_v3_large",
                   "lraspp_mobilenet_v3_large"]
TV_DETECTION = [
    "fasterrcnn_resnet50_fpn", "fasterrcnn_resnet50_fpn_v2", "fasterrcnn_mobilenet_v3_large_fpn",
    "fasterrcnn_mobilenet_v3_large_320_fpn", "maskrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn_v2",
    "keypointrcnn_resnet50_fpn", "retinanet_resnet50_fpn", "retinanet_resnet50_fpn_v2",
    "fcos_resnet50_fpn", "ssd300_vgg16", "ssdlite320_mobilenet_v3_large",
]

TIMM = [
    "resnet18", "resnet50d", "resnext50_32x4d", "seresnext26d_32x4d", "resnetv2_50",
    "wide_resnet50_2", "resnest14d", "res2net50_26w_4s", "regnetx_004", "regnety_008",
    "efficientnet_b0", "efficientnet_b2", "efficientnetv2_rw_s", "tf_efficientnet_lite0",
    "mobilenetv2_100", "mobilenetv3_large_100", "mobilenetv4_conv_small", "mnasnet_100",
    "ghostnet_100", "rexnet_100", "hrnet_w18_small", "dla34", "dpn68", "densenet121",
    "inception_v3", "xception41", "vgg11", "cspresnet50", "cspdarknet53", "darknet53",
    "tresnet_m", "nfnet_l0", "dm_nfnet_f0", "regnetz_b16", "repvgg_a2", "mixnet_s",
    "efficientformer_l1", "levit_128", "convnext_atto", "convnext_tiny", "convnextv2_atto",
    "convnextv2_tiny", "vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224",
    "vit_small_patch16_224.dino", "deit_tiny_patch16_224", "deit_small_distilled_patch16_224",
    "deit3_small_patch16_224", "beit_base_patch16_224", "eva02_tiny_patch14_224",
    "swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "cait_xxs24_224",
    "coat_lite_mini", "crossvit_tiny_240", "pit_ti_224", "twins_svt_small", "xcit_tiny_12_p16_224",
    "maxvit_tiny_tf_224", "maxxvit_rmlp_nano_rw_256", "coatnet_0_rw_224", "coatnext_nano_rw_224",
    "poolformer_s12", "convmixer_768_32", "mixer_b16_224", "resmlp_12_224", "gmlp_ti16_224",
    "edgenext_small", "efficientvit_b0", "mobilevit_s", "mobilevitv2_050", "fastvit_t8",
    "repvit_m1", "tiny_vit_5m_224", "focalnet_tiny_srf", "pvt_v2_b0", "nest_tiny",
    "sequencer2d_s", "visformer_tiny", "gcvit_xxtiny", "davit_tiny", "hgnet_tiny",
    "inception_next_tiny", "resnet34", "resnet101", "efficientnet_b1", "vit_base_patch32_224",
    "convnext_small", "swin_small_patch4_window7_224",
]
TIMM_SHAPES = {"inception_v3": "3,299,299", "swinv2_tiny_window8_256": "3,256,256",
               "maxxvit_rmlp_nano_rw_256": "3,256,256", "crossvit_tiny_240": "3,240,240",
               "mobilevit_s": "3,256,256", "mobilevitv2_050": "3,256,256"}

MONAI = {
    "unet": ["--shape", "1,96,96,96", "--loss", "mse"],
    "basic_unet": ["--shape", "1,96,96,96", "--loss", "mse"],
    "flexible_unet": ["--shape", "1,96,96,96", "--loss", "mse"],
    "segresnet": ["--shape", "1,96,96,96", "--loss", "mse"],
    "segresnet_vae": ["--shape", "1,96,96,96", "--loss", "sum"],
    "swin_unetr": ["--shape", "1,96,96,96", "--loss", "mse"],
    "swin_unetr_v2": ["--shape", "1,96,96,96", "--loss", "mse"],
    "unetr": ["--shape", "1,96,96,96", "--loss", "mse"],
    "dynunet": ["--shape", "1,96,96,96", "--loss", "mse"],
    "attention_unet": ["--shape", "1,96,96,96", "--loss", "mse"],
    "vnet": ["--shape", "1,64,64,64", "--loss", "mse"],
    "densenet121_3d": ["--shape", "1,96,96,96"],
    "resnet18_3d": ["--shape", "1,96,96,96"],
    "highresnet": ["--shape", "1,64,64,64", "--loss", "mse"],
    "vit_3d": ["--shape", "1,96,96,96", "--loss", "sum"],
    "unest_like_autoencoder": ["--shape", "1,64,64,64", "--loss", "mse"],
}


def _hf_lm(name: str, tokens: int = 128) -> list[str]:
    return ["--shape", str(tokens), "--input-dtype", "int64", "--input",
            f"labels={tokens}:int64", "--loss", "model"]


HF = {
    "bert": ["--shape", "128", "--input-dtype", "int64", "--input", "attention_mask=128:int64",
             "--input", "labels=128:int64", "--loss", "model"],
    "roberta": ["--shape", "128", "--input-dtype", "int64", "--input",
                "attention_mask=128:int64", "--input", "labels=128:int64", "--loss", "model"],
    "distilbert": ["--shape", "128", "--input-dtype", "int64"],
    "gpt2": _hf_lm("gpt2"),
    "llama": _hf_lm("llama"),
    "mistral": _hf_lm("mistral"),
    "qwen2": _hf_lm("qwen2"),
    "gemma": _hf_lm("gemma"),
    "phi3": _hf_lm("phi3"),
    "opt": _hf_lm("opt"),
    "gpt_neox": _hf_lm("gpt_neox"),
    "mixtral": _hf_lm("mixtral"),
    "qwen2_moe": _hf_lm("qwen2_moe"),
    "t5": ["--shape", "128", "--input-dtype", "int64"],
    "t5_labels": ["--shape", "128", "--input-dtype", "int64", "--input", "labels=32:int64",
                  "--loss", "model"],
    "bart": ["--shape", "128", "--input-dtype", "int64"],
    "whisper": ["--shape", "80,3000", "--input", "decoder_input_ids=32:int64"],
    "wav2vec2": ["--shape", "16000", "--loss", "sum"],
    "vit": ["--input", "pixel_values=3,224,224", "--input", "labels=:int64", "--loss", "model"],
    "clip": ["--input", "input_ids=16:int64", "--input", "pixel_values=3,224,224",
             "--forward-arg", "return_loss=true", "--loss", "model"],
    "deberta_v2": ["--shape", "128", "--input-dtype", "int64"],
    "electra": ["--shape", "128", "--input-dtype", "int64"],
}


def cases() -> list[tuple[str, str, list[str]]]:
    """Every case: (library, name, ``memcalc estimate`` arguments without the batch size)."""
    tv = "torchvision.models"
    # torchvision's Inception v3 trains with its auxiliary head, which needs 299 x 299 inputs
    found = [("torchvision", name, ["--model", f"{tv}:{name}", *NO_WEIGHTS, "--shape",
                                    "3,299,299" if name == "inception_v3" else IMAGE[1]])
             for name in TV_CLASSIFIERS]
    found += [("torchvision", name, ["--model", f"{tv}.video:{name}", *NO_WEIGHTS, "--shape",
                                     "3,16,224,224" if name.startswith(("mvit", "s3d", "swin"))
                                     else "3,16,112,112"]) for name in TV_VIDEO]
    found += [("torchvision", name, ["--model", f"{tv}.segmentation:{name}",
                                     *DETECTION_WEIGHTS, "--shape", "3,256,256"])
              for name in TV_SEGMENTATION]
    found += [("torchvision detection", name, ["--model", f"{tv}.detection:{name}",
                                               *DETECTION_WEIGHTS, "--shape", "3,320,320",
                                               "--loss", "model"]) for name in TV_DETECTION]
    found += [("timm", name, ["--model", "timm:create_model", "--model-arg", f"model_name={name}",
                              "--model-arg", "pretrained=false", "--shape",
                              TIMM_SHAPES.get(name, "3,224,224")]) for name in TIMM]
    found += [("MONAI 3D", name, ["--model", f"benchmarks.ecosystem_models:monai_{name}", *args])
              for name, args in MONAI.items()]
    found += [("transformers", name, ["--model", f"benchmarks.ecosystem_models:hf_{name}", *args])
              for name, args in HF.items()]
    found += [("memcalc zoo", name, ["--model", name]) for name in ZOO]   # at its own shape
    return sorted(found, key=lambda case: LIBRARIES.index(case[0]))
