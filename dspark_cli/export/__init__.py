"""Export: trained draft -> vLLM draft directory (`writer.py`), static vLLM loader checks (`rules.py`).

Import-light: nothing here imports torch at package import.
"""
