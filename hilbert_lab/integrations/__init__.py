"""Dilated attention inside other libraries' models: `integrations.transformers` (Hugging Face transformers,
optional extra "hf"). Each module imports its library only when used."""
from __future__ import annotations
