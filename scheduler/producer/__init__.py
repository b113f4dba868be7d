"""producer"""
