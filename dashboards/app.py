"""mxperf dashboard script: ``mxperf dash RUNS_DIR`` serves it through ``dashboards/serve.py``.

Pages live in ``views/`` and stay thin: they load finished tables through ``dashboards.ui`` (cached,
RUNS_DIR-confined), compute through ``dashboards.compare``/``summaries``/``fitsview`` and draw with
``dashboards.charts``. The sidebar's comparison picker and the glossary are rendered here, on every page.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # `streamlit run dashboards/app.py` from a checkout without an install
    sys.path.insert(0, str(_ROOT))

import streamlit as st  # noqa: E402

from dashboards import glossary, share, ui  # noqa: E402

# Not "pages/": Streamlit would also serve a sibling pages/ folder as a legacy multipage app, bypassing
# st.navigation (and the sidebar, the pair selector and RUNS_DIR checks) when a page URL is opened directly.
_PAGES = Path(__file__).resolve().parent / "views"
PAGES = [
    ("overview.py", "Overview", "overview", ":material/lightbulb:"),
    ("runs.py", "Runs", "runs", ":material/table:"),
    ("step_time.py", "Step time", "step_time", ":material/timer:"),
    ("breakeven.py", "Breakeven", "breakeven", ":material/show_chart:"),
    ("host_stall.py", "Host stall", "host_stall", ":material/hourglass_empty:"),
    ("timeline.py", "Timeline", "timeline", ":material/view_timeline:"),
    ("kernels.py", "Kernels", "kernels", ":material/memory:"),
    ("diff.py", "Diff", "diff", ":material/difference:"),
    ("consistency.py", "Consistency", "consistency", ":material/compare_arrows:"),
    ("weight_sync.py", "Weight sync", "weight_sync", ":material/sync:"),
    ("add_trace.py", "Add a trace", "add_trace", ":material/upload_file:"),
]

st.set_page_config(page_title="mxperf: BF16 vs MXFP8", layout="wide")
nav = st.navigation(
    [st.Page(str(_PAGES / f), title=t, url_path=u, icon=i, default=(u == "overview")) for f, t, u, i in PAGES]
)
st.sidebar.caption(f"Runs directory: `{ui.runs_dir()}`")
st.session_state[ui.PAIR_KEY] = ui.pair_selector()
share.link_slot()
with st.sidebar.expander("Glossary"):
    st.markdown(glossary.glossary_markdown())
nav.run()
