"""`nasplat report` and `nasplat serve`: one self-contained HTML page about an experiment folder.

`frame` reads the folder into the frames every section shares (and the HTML table helpers), `sections` writes
the sections and the page, `rungs` the ASHA / Hyperband section, `oneshot` the weight-sharing section (and reads a
ground truth), `plots` draws the SVG figures, `output` chooses where the page is written (never into a folder that
cannot be written, never over the experiment's own files), `serve` keeps the page live over HTTP.
"""

from nasplat.report.output import REPORT_FILE
from nasplat.report.sections import build_report, render_report

__all__ = ["REPORT_FILE", "build_report", "render_report"]
