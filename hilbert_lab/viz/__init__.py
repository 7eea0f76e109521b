"""Plotly figure builders and ipywidgets panels over the library (plotly/ipywidgets imported lazily)."""
