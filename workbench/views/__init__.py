"""Views: functions that build Bokeh layouts from analysis DataFrames (they never parse files)."""
