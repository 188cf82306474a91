"""Backends for agent frameworks, each on its own optional extra and imported only when used:
``router.integrations.deepagents`` (LangChain Deep Agents), ``router.integrations.smolagents``
and ``router.integrations.openai_agents`` (the OpenAI Agents SDK).
"""
