"""The medfaq demo in the browser: `medfaq demo` (or `make demo`) serves this script on localhost:8501."""

from __future__ import annotations

import streamlit as st

from medfaq.app.ui import adapt_page, common, queue_page, resources, results_page, search_page
from medfaq.common.runtime import MedfaqError


def main() -> None:
    st.set_page_config(page_title="medfaq — medical FAQ search", page_icon=":material/stethoscope:", layout="wide")
    common.apply_style()
    try:
        resources.settings()
    except MedfaqError as error:  # a wrong setting: one line on the page, as on the command line
        st.error(f"error: {error}", icon=":material/error:")
        st.stop()
    page = st.navigation(
        [
            st.Page(search_page.render, title="Search", icon=":material/search:", url_path="search", default=True),
            st.Page(queue_page.render, title="Expert queue", icon=":material/inbox:", url_path="expert-queue"),
            st.Page(adapt_page.render, title="Adapt", icon=":material/tune:", url_path="adapt"),
            st.Page(results_page.render, title="Results", icon=":material/bar_chart:", url_path="results"),
        ]
    )
    page.run()


if __name__ == "__main__":
    main()
