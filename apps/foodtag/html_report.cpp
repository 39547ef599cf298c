#include "apps/foodtag/html_report.hpp"
