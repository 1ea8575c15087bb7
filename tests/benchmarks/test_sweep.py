"""The sweep over transformers' causal LMs (python -m benchmarks.sweep), bounded: a class we
run agrees with transformers, a class we do not run is refused in one line naming it, and the
table counts what it found."""

from __future__ import annotations

from benchmarks import sweep


def test_a_supported_class_agrees_and_an_unknown_one_is_refused_in_one_line():
    assert sweep.try_class("Qwen3ForCausalLM").status == "agrees"
    refused = sweep.try_class("BertLMHeadModel")
    assert refused.status == "refused", refused
    assert "BertLMHeadModel" in refused.detail and "\n" not in refused.detail


def test_the_classes_are_transformers_causal_lms_and_the_table_counts_them():
    classes = sweep.causal_lm_classes()
    assert "LlamaForCausalLM" in classes and len(classes) > 150
    outcomes = [sweep.Outcome("AForCausalLM", "agrees"),
                sweep.Outcome("BForCausalLM", "refused", "config.json: architecture 'B' is "
                              "not supported.")]
    text = sweep.table(outcomes, "9.9")
    assert "**1 agrees**, **0 differs**, **1 refused**" in text
    assert text.index("`AForCausalLM` | agrees") < text.index("`BForCausalLM` | refused")
