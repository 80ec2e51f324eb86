"""vlrl.train"""
