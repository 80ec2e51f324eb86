"""vlrl.models"""
