"""trl: DPO-family training and outcome reward models on share-question preference packs.

- ``dpo_criterion``: ``preference_loss`` (sigmoid, hinge, ipo, simpo, dpop, kto_pair, sppo_hard, nca_pair, or),
  ``DPOCriterion`` (pref/SFT weighting, PaddleNLP metric names).
- ``logprobs``: per-pair log-prob sums from hidden states + LM-head weight, fp32 log-softmax in token chunks.
- ``dpo_trainer.DPOTrainer`` / ``rm_trainer.RewardTrainer``: ``compute_loss -> (loss_sum, num_pairs, metrics)``.
- ``reward_model.LlamaForScore``: trunk + ``score`` head, saved as HF ``LlamaForSequenceClassification``.
- ``arguments``: ``run_dpo.py`` / ``run_reward.py`` dataclasses and coercions (PaddleNLP key names).
Data: ``paddlenlp_ext.datasets.preference``.
"""
