"""Tests of hilbert_lab.attention."""
