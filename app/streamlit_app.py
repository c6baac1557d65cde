"""The entry script of ``llmslo app``: ``streamlit run <this file> -- --db STORE.duckdb``.

Streamlit runs it as ``__main__``; importing it does nothing.
"""

from __future__ import annotations

from llmslo.app._main import main

if __name__ == "__main__":
    main()
