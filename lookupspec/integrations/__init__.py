"""Adapters from lookupspec to other libraries' interfaces.

LangChain: :mod:`lookupspec.integrations.langchain`.
"""
