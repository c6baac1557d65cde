"""Offline analysis of request summaries."""
