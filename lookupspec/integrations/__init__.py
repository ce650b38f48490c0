"""Adapters from lookupspec to other libraries' interfaces (LangChain: ``lookupspec.integrations.langchain``)."""
