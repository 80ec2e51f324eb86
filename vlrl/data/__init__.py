"""vlrl.data"""
