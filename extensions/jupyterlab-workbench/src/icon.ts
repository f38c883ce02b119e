/** The Workbench icon (sidebar tab, launcher, settings). */

import { LabIcon } from '@jupyterlab/ui-components';

import workbenchSvg from '../style/icons/workbench.svg';

export const workbenchIcon = new LabIcon({
  name: 'jupyterlab-workbench:icon',
  svgstr: workbenchSvg
});
