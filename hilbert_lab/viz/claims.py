"""Claims-report figures: verdict counts per claim."""
from __future__ import annotations

from typing import Any

VERDICT_COLOURS = {"confirmed": "#2ca02c", "refuted": "#d62728", "inconclusive": "#d9a400",
                   "not reproducible here": "#7f7f7f"}


def claims_verdict_figure(summary: Any) -> Any:
    """Stacked bars: for each claim, how many of its experiment rows got each verdict.

    summary: DataFrame with a `claim` column and one count column per verdict.
    """
    import plotly.graph_objects as go

    fig = go.Figure([go.Bar(name=verdict, x=list(summary["claim"]), y=list(summary[verdict]), marker_color=colour)
                     for verdict, colour in VERDICT_COLOURS.items() if verdict in summary])
    fig.update_layout(barmode="stack", title="verdicts per claim (rows of the claimed-vs-measured table)",
                      xaxis_title="claim", yaxis_title="experiments (rows, count)", height=380)
    return fig
