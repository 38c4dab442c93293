"""lora_target_modules: plain layer names (q_proj,v_proj: what the "no module matches" error lists, and what PEFT's
target_modules list means) select the same layers as regexes over the whole dotted name
(model.layers.0.self_attn.q_proj); unset is the default set; an explicit empty value is an error, not the default."""

import pytest

from paddlenlp_ext.peft import LoRALinear, apply_lora
from paddlenlp_ext.peft.lora import DEFAULT_TARGET_MODULES, LoRAConfig
from paddlenlp_ext.transformers import AutoModelForCausalLM
from tests.trl._tiny import make_tiny_model_dir


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_tiny_model_dir(str(tmp_path_factory.mktemp("leaf") / "base"))


def _wrapped(model):
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, LoRALinear)})


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], "q_proj,v_proj", [".*q_proj", ".*self_attn.v_proj"]])
def test_leaf_names_and_regexes_select_the_same_layers(base, targets):
    model = apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2, "lora_target_modules": targets})
    assert _wrapped(model) == ["q_proj", "v_proj"]


def test_a_leaf_name_matches_whole_names_only(base):
    with pytest.raises(ValueError, match="no nn.Linear module matches"):
        apply_lora(AutoModelForCausalLM.from_pretrained(base), {"lora_rank": 2, "lora_target_modules": ["proj"]})


@pytest.mark.parametrize("empty", [[], ""])
def test_empty_target_modules_is_an_error(empty):
    with pytest.raises(ValueError, match=r"lora_target_modules\) is empty.*leave the key unset"):
        LoRAConfig.from_args({"lora_target_modules": empty})


def test_unset_target_modules_is_the_default():
    assert list(LoRAConfig.from_args({"lora_target_modules": None}).target_modules) == list(DEFAULT_TARGET_MODULES)
    assert list(LoRAConfig.from_args({}).target_modules) == list(DEFAULT_TARGET_MODULES)


def test_given_target_modules_are_kept():
    assert LoRAConfig.from_args({"lora_target_modules": ["q_proj", "v_proj"]}).target_modules == ["q_proj", "v_proj"]
