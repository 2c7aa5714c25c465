"""Fine-tune a small, randomly initialised BERT-style classifier with Hugging Face's ``Trainer``
and its default arguments (``dataloader_pin_memory=True`` among them) on one device, as a user
would: ``python hf_trainer_run.py NAME`` selects the accelkit device NAME (or the CPU for
``cpu``), points accelerate at it with ``ACCELERATE_TORCH_DEVICE`` and prints one JSON object:
whether pinning was on, the device the model trained on, whether each batch reached it, and the
logged losses.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

import accelkit


def main(name: str) -> dict:
    device = accelkit.select_device(name)
    os.environ["ACCELERATE_TORCH_DEVICE"] = device.type
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2,
                        # The device's random numbers are not the CPU's: no dropout, so the runs compare.
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 64, (12,), generator=g), "attention_mask": torch.ones(12, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(16)]
    on_device = []

    class Watched(Trainer):
        def training_step(self, model, inputs, *args, **kwargs):
            on_device.append(all(t.device.type == device.type for t in inputs.values()))
            return super().training_step(model, inputs, *args, **kwargs)

    with tempfile.TemporaryDirectory() as out:
        # Defaults but for what keeps the run small and quiet: 4 steps, no reports, no checkpoints.
        args = TrainingArguments(output_dir=out, max_steps=4, per_device_train_batch_size=4, report_to=[],
                                 logging_steps=1, save_strategy="no", disable_tqdm=True)
        trainer = Watched(model=model, args=args, train_dataset=data)
        trainer.train()
    return {
        "pin_memory": args.dataloader_pin_memory,
        "device": str(next(trainer.model.parameters()).device),
        "batches_on_device": on_device,
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
