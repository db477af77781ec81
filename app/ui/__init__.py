"""The Streamlit demo's pages and the resources they share (cached once per server)."""
