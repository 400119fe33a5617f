"""A module of settings that a loss function reads as `loss_settings.weight`
and a training loop changes (api_train.py, scenario attributes)."""

weight = 1.0
