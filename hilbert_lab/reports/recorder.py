"""In-notebook recorder: shows numbers, tables and figures and writes each into metrics.json."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# plotly's JSON mime type only: the executed notebook keeps each figure's data (JupyterLab draws it), not a
# copy of plotly.js (megabytes) per notebook; the pages load the run's one plotly.min.js.
REPORT_RENDERER = "plotly_mimetype"


def to_jsonable(value: Any) -> Any:
    """numpy/torch scalars and arrays, tuples, NaN/inf -> plain JSON values (NaN/inf -> None)."""
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return to_jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if hasattr(value, "item"):
        return to_jsonable(value.item())
    return str(value)


class ReportRecorder:
    """Collects every number a report shows; `metrics.json` in `output_dir` is rewritten on each call.

    metric / table / figure display what they record and return None (so a cell ending in one of them
    does not show it twice).

    Figures go out as plotly JSON (REPORT_RENDERER); the pages rebuilt from metrics.json draw them offline.
    """

    def __init__(self, output_dir: str | Path, report: str, parameters: dict[str, Any] | None = None,
                 *, show: bool = True, png: bool = True) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.report = report
        self.show = show
        self.png = png  # False: figure(png=True) writes no PNG (kaleido starts a browser per image)
        self.data: dict[str, Any] = {
            "report": report,
            "parameters": to_jsonable(parameters or {}),
            "metrics": {},
            "tables": {},
            "figures": {},
        }
        if show:
            import plotly.io as pio

            pio.renderers.default = REPORT_RENDERER
        self.save()

    @property
    def path(self) -> Path:
        return self.output_dir / "metrics.json"

    def save(self) -> Path:
        self.path.write_text(json.dumps(self.data, indent=1, allow_nan=False), encoding="utf-8")
        return self.path

    def _display(self, obj: Any) -> None:
        if self.show:
            from IPython.display import display

            display(obj)

    def metric(self, name: str, value: Any, unit: str = "", note: str = "") -> None:
        """Record and show one number (or short list of numbers)."""
        self.data["metrics"][name] = {"value": to_jsonable(value), "unit": unit, "note": note}
        self.save()
        if self.show:
            from IPython.display import Markdown

            self._display(Markdown(f"**{name}**: {value} {unit}" + (f" ({note})" if note else "")))

    def table(self, name: str, frame: Any, caption: str = "", show: bool = True) -> None:
        """Record and show a pandas DataFrame (all of its cells go to metrics.json); show=False records only."""
        records = frame.reset_index(drop=frame.index.name is None).to_dict(orient="records")
        self.data["tables"][name] = {"caption": caption, "columns": [str(c) for c in frame.columns],
                                     "rows": to_jsonable(records)}
        self.save()
        if self.show and show:
            from IPython.display import Markdown

            if caption:
                self._display(Markdown(f"**{caption}**"))
            self._display(frame)

    def figure(self, name: str, fig: Any, png: bool = False) -> None:
        """Record a plotly figure (title, trace names, the figure as plotly JSON) and show it; `png` also
        writes name.png (kaleido)."""
        title = fig.layout.title.text if fig.layout.title is not None else None
        entry: dict[str, Any] = {"title": title, "traces": [trace.name for trace in fig.data],
                                 "plotly": json.loads(fig.to_json())}
        if png and self.png:
            try:
                path = self.output_dir / f"{name}.png"
                fig.write_image(str(path), width=900, height=500)
                entry["png"] = path.name
            except Exception as error:  # kaleido/chrome missing: the HTML still has the figure
                entry["png_error"] = f"{type(error).__name__}: {error}"[:300]
        self.data["figures"][name] = entry
        self.save()
        if self.show:
            fig.show()
