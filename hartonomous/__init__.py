"""Hartonomous."""
