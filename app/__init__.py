"""The Optimus Lens Streamlit app (``optimus app``; its router is ``app/main.py``) and its session logic."""
