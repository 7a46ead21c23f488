"""The Optimus Lens Streamlit app (``streamlit run app/main.py``) and its session logic."""
